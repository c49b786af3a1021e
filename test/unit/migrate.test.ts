import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStore, type Store } from "../../src/store/db.ts";
import { migrate, SUPERSEDED_MIGRATION_HASHES } from "../../src/store/migrate.ts";
import type { EmbeddedMigration } from "../../src/store/migrations.macro.ts";

let dir: string;
let store: Store;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "licensing-migrate-"));
  store = openStore(join(dir, "licensing.db"));
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

const recorded = () =>
  store.sqlite
    .query<{ tag: string; hash: string }, []>("SELECT tag, hash FROM schema_migrations ORDER BY tag")
    .all();
const tables = () =>
  store.sqlite
    .query<{ name: string }, []>("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    .all()
    .map((row) => row.name);

describe("the embedded migrations", () => {
  test("a fresh database gets every migration and records each with its hash", () => {
    const result = migrate(store.sqlite);
    expect(result.applied.length).toBeGreaterThan(0);
    expect(result.current).toBe(result.applied.at(-1) ?? null);
    expect(recorded().map((row) => row.tag)).toEqual(result.applied);
    for (const row of recorded()) expect(row.hash).toMatch(/^[0-9a-f]{64}$/);
    expect(tables()).toEqual(expect.arrayContaining(["workspace", "api_keys", "idempotency_records"]));
  });

  test("migrating a second time is a no-op", () => {
    const first = migrate(store.sqlite);
    const before = { recorded: recorded(), tables: tables() };
    const second = migrate(store.sqlite);
    expect(second.applied).toEqual([]);
    expect(second.current).toBe(first.current);
    expect({ recorded: recorded(), tables: tables() }).toEqual(before);
  });

  test("the migrations survive closing and reopening the file", () => {
    migrate(store.sqlite);
    store.close();
    store = openStore(join(dir, "licensing.db"));
    expect(migrate(store.sqlite).applied).toEqual([]);
  });

  test("a database that records a migration this binary does not know is refused", () => {
    migrate(store.sqlite);
    store.sqlite.run("INSERT INTO schema_migrations (tag, hash, applied_at) VALUES (?, ?, ?)", [
      "9999_from_the_future",
      "0".repeat(64),
      0,
    ]);
    expect(() => migrate(store.sqlite)).toThrow(/newer version \(9999_from_the_future\)/);
  });

  test("a database that ran an earlier text of a migration (a superseded hash) upgrades, re-recorded with today's hash", () => {
    const { applied } = migrate(store.sqlite);
    const now = recorded();
    store.sqlite.run("UPDATE schema_migrations SET hash = ? WHERE tag = ?", [
      SUPERSEDED_MIGRATION_HASHES["0026_verification_counted"]?.[0] ?? "",
      "0026_verification_counted",
    ]);
    expect(applied).toContain("0026_verification_counted");
    expect(migrate(store.sqlite).applied).toEqual([]);
    expect(recorded()).toEqual(now);
  });

  test("a superseded hash is accepted only for its own migration", () => {
    migrate(store.sqlite);
    store.sqlite.run("UPDATE schema_migrations SET hash = ? WHERE tag = ?", [
      SUPERSEDED_MIGRATION_HASHES["0026_verification_counted"]?.[0] ?? "",
      "0025_device_index_status_first",
    ]);
    expect(() => migrate(store.sqlite)).toThrow(/migration 0025_device_index_status_first differs/);
  });

  test("a database whose recorded hash differs from the embedded migration is refused", () => {
    const { applied } = migrate(store.sqlite);
    store.sqlite.run("UPDATE schema_migrations SET hash = ? WHERE tag = ?", [
      "f".repeat(64),
      applied[0] ?? "",
    ]);
    expect(() => migrate(store.sqlite)).toThrow(/differs from the one applied/);
  });
});

describe("applying migrations", () => {
  const migration = (tag: string, statements: string[]): EmbeddedMigration => ({
    tag,
    when: 0,
    hash: tag.padEnd(64, "0"),
    statements,
  });

  test("pending migrations are applied in order after the ones already recorded", () => {
    const first = migration("0001_a", ["CREATE TABLE a (id INTEGER)"]);
    const second = migration("0002_b", ["CREATE TABLE b (id INTEGER)", "INSERT INTO b VALUES (1)"]);
    expect(migrate(store.sqlite, [first]).applied).toEqual(["0001_a"]);
    expect(migrate(store.sqlite, [first, second]).applied).toEqual(["0002_b"]);
    expect(tables()).toEqual(expect.arrayContaining(["a", "b"]));
  });

  test("a migration that fails half-way leaves nothing behind and is not recorded", () => {
    const broken = migration("0001_broken", ["CREATE TABLE half (id INTEGER)", "THIS IS NOT SQL"]);
    expect(() => migrate(store.sqlite, [broken])).toThrow();
    expect(tables()).not.toContain("half");
    expect(recorded()).toEqual([]);
  });
});
