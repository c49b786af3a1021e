import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";

/**
 * Migration 0040 keeps each subscription's starting expiry, which its license carried alone
 * before: for a store upgraded with subscriptions in it, the license's expiry at the upgrade is
 * the best record there is (test/integration/upgrade-every-schema.test.ts checks every other row
 * keeps its values).
 */
const MIGRATIONS = embeddedMigrations();
const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

test("a subscription's starting expiry is its license's expiry at the upgrade: none for a license that never expires or none made yet", () => {
  const at = MIGRATIONS.findIndex((m) => m.tag === "0040_billing_subscription_start");
  expect(at).toBeGreaterThan(0);
  const dir = mkdtempSync(join(tmpdir(), "licensing-0040-"));
  dirs.push(dir);
  const store = openStore(join(dir, "licensing.db"));
  try {
    const sqlite = store.sqlite;
    migrate(sqlite, MIGRATIONS.slice(0, at));
    // Only the columns these rows need: the product and policy they name are not the point here.
    sqlite.run("PRAGMA foreign_keys = OFF");
    const license = sqlite.prepare<unknown, [string, number | null]>(
      `INSERT INTO licenses (id, environment, product_id, policy_id, key_ciphertext, key_lookup, license_type,
         status, renewal_authority, entitlements, metadata, version, created_at, updated_at, expires_at)
       VALUES (?1, 'live', 'prod_x', 'pol_x', 'c', ?1, 'subscription', 'active', 'external_billing', '{}', '{}', 1, 0, 0, ?2)`,
    );
    const subscription = sqlite.prepare<unknown, [string, string | null]>(
      `INSERT INTO billing_subscriptions (environment, subscription_id, license_id, paid_through, ends_at, updated_at)
       VALUES ('live', ?, ?, NULL, NULL, 0)`,
    );
    const expiry = Date.UTC(2027, 5, 1);
    license.run("lic_expiring", expiry);
    license.run("lic_perpetual", null);
    subscription.run("sub_expiring", "lic_expiring");
    subscription.run("sub_perpetual", "lic_perpetual");
    subscription.run("sub_awaiting_checkout", null);
    sqlite.run("PRAGMA foreign_keys = ON");

    migrate(sqlite);
    const starts = sqlite
      .query<{ subscription_id: string; starting_end: number | null }, []>(
        "SELECT subscription_id, starting_end FROM billing_subscriptions ORDER BY subscription_id",
      )
      .all();
    expect(starts).toEqual([
      { subscription_id: "sub_awaiting_checkout", starting_end: null },
      { subscription_id: "sub_expiring", starting_end: expiry },
      { subscription_id: "sub_perpetual", starting_end: null },
    ]);
  } finally {
    store.close();
  }
});
