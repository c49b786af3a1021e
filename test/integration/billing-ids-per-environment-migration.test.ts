import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStore, type Store } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";

/**
 * Migration 0044: billing event ids and checkout ids become unique per environment. The tables
 * are copied into new ones with the new keys; every row of a store made before must come through
 * as it was, and the integration's new last-failure columns start empty.
 */
let dir: string;
let store: Store;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "licensing-0044-"));
  store = openStore(join(dir, "licensing.db"));
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

const rows = (sql: string) => store.sqlite.query(sql).all();

test("billing events and checkouts keep every row through 0044, and an id may then recur in the other environment", () => {
  const migrations = embeddedMigrations();
  const at = migrations.findIndex((m) => m.tag.startsWith("0044_"));
  expect(at).toBeGreaterThan(0);
  migrate(store.sqlite, migrations.slice(0, at));
  // The checkouts' licenses exist, as the foreign key has always made sure; their own products
  // and policies are not the point here, so that key is left unchecked while they are written.
  store.sqlite.run("PRAGMA foreign_keys = OFF");
  const license = store.sqlite.prepare(
    `INSERT INTO licenses (id, environment, product_id, policy_id, key_ciphertext, key_lookup, license_type,
       status, renewal_authority, entitlements, metadata, version, created_at, updated_at)
     VALUES (?1, ?2, 'prod_x', 'pol_x', 'c', ?1, 'subscription', 'active', 'external_billing', '{}', '{}', 1, 0, 0)`,
  );
  for (const [id, environment] of [
    ["lic_1", "live"],
    ["lic_2", "test"],
    ["lic_3", "test"],
  ])
    license.run(id as string, environment as string);
  store.sqlite.run(
    `INSERT INTO billing_events (event_id, environment, type, result, reason, license_id, attempts, created_at, updated_at)
     VALUES ('evt_1', 'live', 'checkout.session.completed', 'succeeded', NULL, 'lic_1', 1, 1000, 1000),
            ('evt_2', 'test', 'invoice.paid', 'failed', 'no_period_end', NULL, 3, 2000, 2500)`,
  );
  store.sqlite.run(
    `INSERT INTO billing_checkouts (checkout_id, environment, license_id, offering_id, subscription_id, created_at)
     VALUES ('cs_1', 'live', 'lic_1', 'bof_1', 'sub_1', 1000), ('cs_2', 'test', 'lic_2', 'bof_2', NULL, 1500)`,
  );
  store.sqlite.run(
    `INSERT INTO billing_integrations (environment, provider, status, api_base_url, secure_claims,
       last_event_id, last_event_type, last_event_result, last_event_reason, last_event_at, created_at, updated_at)
     VALUES ('live', 'stripe', 'active', 'https://api.stripe.com', 1, 'evt_1', 'checkout.session.completed',
       'succeeded', NULL, 1000, 900, 900)`,
  );
  const events = rows("SELECT * FROM billing_events ORDER BY event_id");
  const checkouts = rows("SELECT * FROM billing_checkouts ORDER BY checkout_id");
  store.sqlite.run("PRAGMA foreign_keys = ON");

  migrate(store.sqlite, migrations);

  expect(rows("SELECT * FROM billing_events ORDER BY event_id")).toEqual(events);
  expect(rows("SELECT * FROM billing_checkouts ORDER BY checkout_id")).toEqual(checkouts);
  expect(
    rows(
      "SELECT last_event_id, last_failure_id, last_failure_type, last_failure_reason, last_failure_at FROM billing_integrations",
    ),
  ).toEqual([
    {
      last_event_id: "evt_1",
      last_failure_id: null,
      last_failure_type: null,
      last_failure_reason: null,
      last_failure_at: null,
    },
  ]);
  // The same ids in the other environment are other rows now; in the same one, still refused.
  store.sqlite.run(
    `INSERT INTO billing_events (event_id, environment, type, result, attempts, created_at, updated_at)
     VALUES ('evt_1', 'test', 'ping', 'ignored', 1, 3000, 3000)`,
  );
  store.sqlite.run(
    `INSERT INTO billing_checkouts (checkout_id, environment, license_id, offering_id, created_at)
     VALUES ('cs_1', 'test', 'lic_3', 'bof_3', 3000)`,
  );
  expect(() =>
    store.sqlite.run(
      `INSERT INTO billing_events (event_id, environment, type, result, attempts, created_at, updated_at)
       VALUES ('evt_1', 'live', 'ping', 'ignored', 1, 3000, 3000)`,
    ),
  ).toThrow(/UNIQUE/);
  expect(() =>
    store.sqlite.run(
      `INSERT INTO billing_checkouts (checkout_id, environment, license_id, offering_id, created_at)
       VALUES ('cs_1', 'live', 'lic_3', 'bof_4', 3000)`,
    ),
  ).toThrow(/UNIQUE/);
  expect(store.sqlite.query("PRAGMA foreign_key_check(billing_checkouts)").all()).toEqual([]);
});
