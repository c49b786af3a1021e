import { Database } from "bun:sqlite";
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";
import {
  createFirstSchemaDataDir,
  expectUpgradedDataIntact,
  FIRST_SCHEMA_PASSPHRASE,
} from "../support/first-schema.ts";
import {
  BUILD_TIMEOUT_MS,
  executable,
  removeTempDirs,
  runServeToExit,
  type ServerProcess,
  startServe,
  tempDir,
} from "./binary.ts";

/**
 * The acceptance test of issue 8: a data dir created by the first released schema (migration 0000
 * only, rows written in its columns) is opened by the current executable, and all data is intact.
 */
let server: ServerProcess | undefined;
beforeAll(() => {
  executable();
}, BUILD_TIMEOUT_MS);
afterAll(async () => {
  await server?.stop("SIGKILL");
  removeTempDirs();
});

test("the executable migrates a first-schema data dir forward and every row reads back intact", async () => {
  const data = createFirstSchemaDataDir(join(tempDir(), "data"));
  server = await startServe(["--data-dir", data.dataDir], {
    env: { LICENSING_KEYSTORE_PASSPHRASE: FIRST_SCHEMA_PASSPHRASE },
  });
  const ready = await server.logLine((line) => line.msg === "store ready");
  expect(ready?.applied).toEqual(
    embeddedMigrations()
      .slice(1)
      .map((m) => m.tag),
  );
  await expectUpgradedDataIntact(server.url, data);
  expect(await server.stop("SIGTERM")).toBe(0);
  server = undefined;
}, 60_000);

test("the executable refuses a store migrated by a newer version, and leaves it untouched", async () => {
  const data = createFirstSchemaDataDir(join(tempDir(), "data"));
  const store = new Database(join(data.dataDir, "licensing.db"));
  store.run("INSERT INTO schema_migrations (tag, hash, applied_at) VALUES ('9999_from_the_future', 'x', 0)");
  store.close();
  const before = readFileSync(join(data.dataDir, "licensing.db"));
  const result = await runServeToExit(["--data-dir", data.dataDir], {
    env: { LICENSING_KEYSTORE_PASSPHRASE: FIRST_SCHEMA_PASSPHRASE },
  });
  expect(result.exitCode).toBe(1);
  expect(result.stderr).toContain("migrated by a newer version (9999_from_the_future); upgrade this binary");
  expect(readFileSync(join(data.dataDir, "licensing.db")).equals(before)).toBe(true);
});

test("the executable refuses a store whose applied migration differs from its own, and leaves it untouched", async () => {
  const data = createFirstSchemaDataDir(join(tempDir(), "data"));
  const store = new Database(join(data.dataDir, "licensing.db"));
  store.run("UPDATE schema_migrations SET hash = ? WHERE tag = '0000_initial'", ["0".repeat(64)]);
  store.close();
  const before = readFileSync(join(data.dataDir, "licensing.db"));
  const result = await runServeToExit(["--data-dir", data.dataDir], {
    env: { LICENSING_KEYSTORE_PASSPHRASE: FIRST_SCHEMA_PASSPHRASE },
  });
  expect(result.exitCode).toBe(1);
  expect(result.stderr).toContain("migration 0000_initial differs from the one applied to this database");
  expect(readFileSync(join(data.dataDir, "licensing.db")).equals(before)).toBe(true);
});

test("a store that needs migrations is not migrated while another process has it open (a server from before serve.lock): serve refuses and changes nothing", async () => {
  const data = createFirstSchemaDataDir(join(tempDir(), "data"));
  const recorded = (db: Database) =>
    db.query<{ tag: string }, []>("SELECT tag FROM schema_migrations ORDER BY tag").all();
  // Such a server holds no lock file, only its connection to the store, which it has read.
  const older = new Database(join(data.dataDir, "licensing.db"));
  try {
    const before = recorded(older);
    const result = await runServeToExit(["--data-dir", data.dataDir], {
      env: { LICENSING_KEYSTORE_PASSPHRASE: FIRST_SCHEMA_PASSPHRASE },
    });
    expect(result.exitCode).toBe(1);
    expect(result.stderr).toContain("needs migrations, and another process has it open");
    expect(recorded(older)).toEqual(before);
  } finally {
    older.close();
  }
  // Once it has stopped, the same start migrates.
  server = await startServe(["--data-dir", data.dataDir], {
    env: { LICENSING_KEYSTORE_PASSPHRASE: FIRST_SCHEMA_PASSPHRASE },
  });
  expect((await server.logLine((line) => line.msg === "store ready"))?.applied).toHaveLength(
    embeddedMigrations().length - 1,
  );
  await expectUpgradedDataIntact(server.url, data);
  expect(await server.stop("SIGTERM")).toBe(0);
  server = undefined;
}, 60_000);
