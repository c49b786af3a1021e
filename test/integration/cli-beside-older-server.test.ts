import { Database } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { finishInit, initialise } from "../../src/cli/init.ts";
import { STORE_OPEN_ELSEWHERE } from "../../src/cli/shared.ts";
import { resolveConfig } from "../../src/config.ts";
import { openStore } from "../../src/store/db.ts";
import { migrate, SUPERSEDED_MIGRATION_HASHES } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";
import { type ServeLock, takeServeLock } from "../../src/store/serve-lock.ts";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * A command of a newer executable beside a running older server: the store needs migrations the
 * server has not run, and applying them under it would leave the rows it writes afterwards without
 * what the new columns mean, and stop it from starting again. The command refuses and changes
 * nothing; with no server running it migrates; with nothing to migrate it works beside a server.
 */
const MIGRATIONS = embeddedMigrations();
const REFUSAL =
  "licensing keys list: the running server is older than this executable (the store needs migrations it has not run): " +
  "upgrade the server and restart it first, or stop it\n";

let work: string;
let dataDir: string;
let lock: ServeLock | null = null;
beforeEach(() => {
  work = mkdtempSync(join(tmpdir(), "cli-beside-older-server-"));
  dataDir = join(work, "data");
});
afterEach(() => {
  lock?.release();
  lock = null;
  rmSync(work, { recursive: true, force: true });
});

const storePath = () => join(dataDir, "licensing.db");
const lockPath = () => join(dataDir, "serve.lock");
const keysList = () => runInProcess(["keys", "list", "--json", "--data-dir", dataDir], work);

/** The store as a server of the build before the last migration left it. */
function storeOneMigrationBehind(): void {
  mkdirSync(dataDir, { mode: 0o700 });
  const store = openStore(storePath());
  try {
    migrate(store.sqlite, MIGRATIONS.slice(0, -1));
  } finally {
    store.close();
  }
}

/** As a running server holds it: another connection in this process sees it held, as another process would. */
const holdServeLock = () => {
  lock = takeServeLock(lockPath());
  expect(lock).not.toBeNull();
};

function recordedMigrations(): { tag: string; hash: string }[] {
  const db = new Database(storePath(), { readonly: true });
  try {
    return db
      .query<{ tag: string; hash: string }, []>("SELECT tag, hash FROM schema_migrations ORDER BY tag")
      .all();
  } finally {
    db.close();
  }
}

describe("a store that needs migrations", () => {
  test("is not migrated while a server holds the lock: the command says the server is older and exits 1", async () => {
    storeOneMigrationBehind();
    holdServeLock();
    const before = recordedMigrations();
    expect(before.length).toBe(MIGRATIONS.length - 1);

    const result = await keysList();

    expect(result.code).toBe(1);
    expect(result.stdout).toBe("");
    expect(result.stderr).toBe(REFUSAL);
    expect(recordedMigrations()).toEqual(before);
  });

  test("is not migrated while a server from before serve.lock has it open: the command says so and exits 1", async () => {
    storeOneMigrationBehind();
    // Such a server holds no lock file, only its connection to the store, which it has read.
    const server = new Database(storePath());
    try {
      server.query("SELECT count(*) FROM schema_migrations").get();
      const before = recordedMigrations();

      const result = await keysList();

      expect(result.code).toBe(1);
      expect(result.stderr).toBe(`licensing keys list: ${STORE_OPEN_ELSEWHERE}\n`);
      expect(recordedMigrations()).toEqual(before);
      expect(existsSync(lockPath())).toBe(false);
      // The server goes on writing to the store the command left alone.
      server.run("INSERT INTO schema_migrations (tag, hash, applied_at) VALUES ('zz_probe', 'x', 0)");
      server.run("DELETE FROM schema_migrations WHERE tag = 'zz_probe'");
    } finally {
      server.close();
    }
  });

  test("is migrated through a connection that no server can read beside, of whatever version", () => {
    storeOneMigrationBehind();
    const migrating = openStore(storePath(), { alone: true });
    const starting = new Database(storePath());
    try {
      expect(() => starting.query("SELECT count(*) FROM schema_migrations").get()).toThrow(/locked/);
      expect(() => openStore(storePath(), { alone: true })).toThrow(/locked/);
    } finally {
      starting.close();
      migrating.close();
    }
  });

  test("is migrated once the server has stopped, its lock file left behind", async () => {
    storeOneMigrationBehind();
    holdServeLock();
    lock?.release();

    const result = await keysList();

    expect(result.code).toBe(0);
    expect(recordedMigrations().map((row) => row.tag)).toEqual(MIGRATIONS.map((m) => m.tag).sort());
    // The command held the lock only while it migrated: a server starts after it.
    holdServeLock();
  });

  test("is migrated where no server ever ran, and the command leaves no lock file of its own", async () => {
    storeOneMigrationBehind();

    const result = await keysList();

    expect(result.code).toBe(0);
    expect(recordedMigrations().length).toBe(MIGRATIONS.length);
    expect(existsSync(lockPath())).toBe(false);
  });

  test("is migrated when serve.lock is a file no server could lock", async () => {
    storeOneMigrationBehind();
    writeFileSync(lockPath(), "not a database, and no server's lock");

    expect((await keysList()).code).toBe(0);
    expect(recordedMigrations().length).toBe(MIGRATIONS.length);
  });

  test("whose only change is a superseded checksum to re-record keeps it while a server holds the lock", async () => {
    const [tag, hashes] = Object.entries(SUPERSEDED_MIGRATION_HASHES)[0] ?? [];
    if (tag === undefined || hashes?.[0] === undefined)
      throw new Error("no superseded checksum to test with");
    mkdirSync(dataDir, { mode: 0o700 });
    const store = openStore(storePath());
    migrate(store.sqlite);
    // As the server of the build in between recorded it: that server refuses any other checksum.
    store.sqlite.run("UPDATE schema_migrations SET hash = ? WHERE tag = ?", [hashes[0], tag]);
    store.close();
    holdServeLock();
    const before = recordedMigrations();

    const result = await keysList();

    expect(result.code).toBe(1);
    expect(result.stderr).toBe(REFUSAL);
    expect(recordedMigrations()).toEqual(before);
  });
});

describe("a store with nothing to migrate", () => {
  test("is read and written by commands while a server holds the lock", async () => {
    finishInit(initialise(resolveConfig({ "data-dir": dataDir }, {}, work)));
    holdServeLock();
    const server = new Database(storePath());
    server.query("SELECT count(*) FROM schema_migrations").get();
    const before = recordedMigrations();

    const listed = await keysList();
    const created = await runInProcess(
      [
        "keys",
        "create",
        "--env",
        "test",
        "--scopes",
        "all",
        "--name",
        "beside the server",
        "--data-dir",
        dataDir,
      ],
      work,
    );
    const plan = await runInProcess(["plan", "show", "--data-dir", dataDir], work);

    server.close();
    expect([listed.code, created.code, plan.code]).toEqual([0, 0, 0]);
    expect(recordedMigrations()).toEqual(before);
  });
});
