import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStore, type Store } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";

/**
 * Migration 0030: at most one active signing key per product. A store where a rotation by an
 * older version stopped half-way has two; the one the server signed with (inserted first) stays
 * active and the others are retired, never listed, so the unique index can be built.
 */
let dir: string;
let store: Store;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "licensing-0030-"));
  store = openStore(join(dir, "licensing.db"));
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

const keys = () =>
  store.sqlite
    .query<{ key_id: string; status: string; not_after: number | null }, []>(
      "SELECT key_id, status, not_after FROM signing_keys ORDER BY rowid",
    )
    .all();

test("a product left with two active keys keeps the first one active, and a second active key is refused afterwards", () => {
  const migrations = embeddedMigrations();
  const at = migrations.findIndex((m) => m.tag.startsWith("0030_"));
  expect(at).toBeGreaterThan(0);
  migrate(store.sqlite, migrations.slice(0, at));
  // Key rows alone: the products they point at do not matter to this migration.
  store.sqlite.run("PRAGMA foreign_keys = OFF");
  const insert = store.sqlite.prepare(
    `INSERT INTO signing_keys (key_id, product_id, public_key, status, not_before, not_after, created_at)
     VALUES (?, ?, 'ed25519:x', ?, ?, ?, ?)`,
  );
  insert.run("k_old_retired", "prod_a", "retired", 100, 500, 100_000);
  insert.run("k_first", "prod_a", "active", 200, null, 200_000);
  insert.run("k_half_done", "prod_a", "active", 300, null, 300_000);
  insert.run("k_other", "prod_b", "active", 300, null, 300_000);
  migrate(store.sqlite, migrations);
  expect(keys()).toEqual([
    { key_id: "k_old_retired", status: "retired", not_after: 500 },
    { key_id: "k_first", status: "active", not_after: null },
    { key_id: "k_half_done", status: "retired", not_after: 300 },
    { key_id: "k_other", status: "active", not_after: null },
  ]);
  expect(() => insert.run("k_second", "prod_b", "active", 400, null, 400_000)).toThrow(/UNIQUE/);
  insert.run("k_retired_too", "prod_b", "retired", 400, 500, 400_000);
});
