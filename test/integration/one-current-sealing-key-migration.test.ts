import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";

/**
 * 0033_sealing_key_lifecycle: a store made before sealing keys had a current key gets one per
 * product, the key its server used (the first active one inserted), so the status route and the
 * seal line stay what they were across the upgrade.
 */
const MIGRATIONS = embeddedMigrations();
const dir = mkdtempSync(join(tmpdir(), "sealing-key-migration-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("an upgraded store makes each product's first active sealing key current, and only that one", () => {
  const at = MIGRATIONS.findIndex((m) => m.tag === "0033_sealing_key_lifecycle");
  expect(at).toBeGreaterThan(0);
  const store = openStore(join(dir, "licensing.db"));
  try {
    migrate(store.sqlite, MIGRATIONS.slice(0, at));
    // Only the key rows matter here; the products they name are left out.
    store.sqlite.run("PRAGMA foreign_keys = OFF");
    const insert = (keyId: string, productId: string, status: string) =>
      store.sqlite.run(
        "INSERT INTO sealing_keys (key_id, product_id, environment, public_key, status, created_at, retired_at) VALUES (?, ?, 'live', 'p256:x', ?, 0, NULL)",
        [keyId, productId, status],
      );
    insert("k_b0000000000000000000", "prod_one", "active");
    insert("k_a0000000000000000000", "prod_one", "active"); // never made by the service; lower id, later row
    insert("k_c0000000000000000000", "prod_two", "retired");
    insert("k_d0000000000000000000", "prod_two", "active");
    insert("k_e0000000000000000000", "prod_three", "compromised");
    store.sqlite.run("PRAGMA foreign_keys = ON");
    migrate(store.sqlite);
    const rows = store.sqlite
      .query<{ key_id: string; status: string; is_current: number }, []>(
        "SELECT key_id, status, is_current FROM sealing_keys ORDER BY key_id",
      )
      .all();
    expect(rows).toEqual([
      { key_id: "k_a0000000000000000000", status: "active", is_current: 0 },
      { key_id: "k_b0000000000000000000", status: "active", is_current: 1 },
      { key_id: "k_c0000000000000000000", status: "retired", is_current: 0 },
      { key_id: "k_d0000000000000000000", status: "active", is_current: 1 },
      { key_id: "k_e0000000000000000000", status: "compromised", is_current: 0 },
    ]);
    // From now on the store itself refuses a second current key for a product.
    expect(() =>
      store.sqlite.run("UPDATE sealing_keys SET is_current = 1 WHERE key_id = 'k_a0000000000000000000'"),
    ).toThrow(/UNIQUE/);
  } finally {
    store.close();
  }
});
