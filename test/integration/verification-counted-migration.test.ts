import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStore, type Store } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";

/**
 * Migration 0026: verifications from before carry `counted` from `sent` (a mailed code was let
 * through; an unsent one is taken as held back), so a user's limits and wrong-code budget go on
 * across the upgrade instead of starting afresh.
 */
let dir: string;
let store: Store;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "licensing-0026-"));
  store = openStore(join(dir, "licensing.db"));
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

test("verifications from before 0026 count as they were sent, and the per-user index is gone", () => {
  const migrations = embeddedMigrations();
  const at = migrations.findIndex((m) => m.tag.startsWith("0026_"));
  expect(at).toBeGreaterThan(0);
  migrate(store.sqlite, migrations.slice(0, at));
  const insert = store.sqlite.prepare(
    `INSERT INTO email_verifications (id, environment, product_id, subject_hash, device_thumbprint,
       code_hash, address_hash, sent, expires_at, created_at)
     VALUES (?, 'live', 'prod_x', 'subject', 'thumb', 'hash', 'address', ?, 0, 0)`,
  );
  insert.run("ver_sent", 1);
  insert.run("ver_unsent", 0);
  migrate(store.sqlite, migrations);
  const counted = store.sqlite
    .query<{ id: string; counted: number }, []>("SELECT id, counted FROM email_verifications ORDER BY id")
    .all();
  expect(counted).toEqual([
    { id: "ver_sent", counted: 1 },
    { id: "ver_unsent", counted: 0 },
  ]);
  const indexes = store.sqlite
    .query<{ name: string }, []>(
      "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'email_verifications'",
    )
    .all()
    .map((row) => row.name);
  expect(indexes).toContain("email_verifications_subject_counted");
  expect(indexes).not.toContain("email_verifications_user");
});
