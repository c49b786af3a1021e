import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStore, type Store } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";

/**
 * Migration 0029: the license.expired scan now skips a license by the expiry it recorded as
 * announced, not by `updated_at`. Expiries the scan had not reached at the upgrade, and that the
 * scan before it would have skipped (changed at or after they passed: a billing cancellation that
 * announced itself), are recorded as announced, so the upgrade announces nothing twice.
 */
let dir: string;
let store: Store;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "licensing-0029-"));
  store = openStore(join(dir, "licensing.db"));
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

test("expiries past the scan's mark that were changed after they passed count as announced after 0029", () => {
  const migrations = embeddedMigrations();
  const at = migrations.findIndex((m) => m.tag.startsWith("0029_"));
  expect(at).toBeGreaterThan(0);
  migrate(store.sqlite, migrations.slice(0, at));
  store.sqlite.run("PRAGMA foreign_keys = OFF");
  store.sqlite.run("INSERT INTO webhook_marks (name, value) VALUES ('license.expired', 1000)");
  const insert = store.sqlite.prepare(
    `INSERT INTO licenses (id, environment, product_id, policy_id, key_ciphertext, key_lookup, license_type,
       status, renewal_authority, entitlements, metadata, version, created_at, updated_at, expires_at)
     VALUES (?1, 'live', 'prod_x', 'pol_x', 'c', ?1, 'subscription', 'active', 'vendor', '{}', '{}', 1, 0, ?2, ?3)`,
  );
  insert.run("lic_ended_at_once", 2000, 2000);
  insert.run("lic_not_yet_expired", 500, 5000);
  insert.run("lic_before_the_mark", 900, 800);
  migrate(store.sqlite, migrations);
  const rows = store.sqlite
    .query<{ id: string; expiry_announced: number | null }, []>(
      "SELECT id, expiry_announced FROM licenses ORDER BY id",
    )
    .all();
  expect(rows).toEqual([
    { id: "lic_before_the_mark", expiry_announced: null },
    { id: "lic_ended_at_once", expiry_announced: 2000 },
    { id: "lic_not_yet_expired", expiry_announced: null },
  ]);
});
