import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { takeBackup } from "../../src/cli/backup.ts";
import { restoreBackup } from "../../src/cli/restore.ts";
import { resolveConfig } from "../../src/config.ts";
import { StartupError } from "../../src/startup-checks.ts";
import { takeServeLock } from "../../src/store/serve-lock.ts";
import { expectCliError } from "../support/backup.ts";
import { createTestContext, serveTestStore, type TestContext } from "../support/harness.ts";

/**
 * `DIR/serve.lock`: one server per data directory (the e2e test covers other processes and
 * kill -9). A stopped server's lock file is not data, so a restore may go where one stood, but
 * never where one runs; and a lock file that is not one says so by name.
 */
const ENV = { LICENSING_KEYSTORE_PASSPHRASE: "test passphrase" };
let t: TestContext;
let scratch: string;
beforeEach(() => {
  t = createTestContext();
  scratch = mkdtempSync(join(tmpdir(), "licensing-serve-lock-"));
});
afterEach(() => {
  t.close();
  rmSync(scratch, { recursive: true, force: true });
});

const backupOf = () => {
  const out = join(scratch, "backup");
  takeBackup(resolveConfig({ "data-dir": t.dir }, ENV, scratch), out, { includePassphrase: false });
  return out;
};

test("a second server on the data dir is refused while the first runs, and starts once it has stopped", async () => {
  const first = serveTestStore(t);
  expect(() => serveTestStore(t)).toThrow(/another licensing serve is running on/);
  await first.shutdown("test");
  const second = serveTestStore(t);
  await second.shutdown("test");
});

test("the lock adds one file to the data directory, serve.lock, and nothing beside it", () => {
  const dir = join(scratch, "data");
  mkdirSync(dir);
  const lock = takeServeLock(join(dir, "serve.lock"));
  try {
    expect(readdirSync(dir)).toEqual(["serve.lock"]);
  } finally {
    lock?.release();
  }
  expect(readdirSync(dir)).toEqual(["serve.lock"]);
});

test("a restore goes into a directory that holds only a stopped server's lock file", () => {
  const target = join(scratch, "target");
  mkdirSync(target);
  takeServeLock(join(target, "serve.lock"))?.release();
  restoreBackup(resolveConfig({ "data-dir": target }, ENV, scratch), backupOf());
});

test("a restore is refused where a server holds the lock, and writes nothing there", () => {
  const target = join(scratch, "target");
  mkdirSync(target);
  const held = takeServeLock(join(target, "serve.lock"));
  expect(held).not.toBeNull();
  try {
    expectCliError(
      () => restoreBackup(resolveConfig({ "data-dir": target }, ENV, scratch), backupOf()),
      /a licensing serve is running on .*; stop it before restoring there/,
    );
  } finally {
    held?.release();
  }
});

test("a lock file that is not one stops the server with a message that names it", () => {
  writeFileSync(join(t.dir, "serve.lock"), "not a lock: some bytes a tool left here, long enough to be read");
  let thrown: unknown;
  try {
    serveTestStore(t);
  } catch (error) {
    thrown = error;
  }
  expect(thrown).toBeInstanceOf(StartupError);
  expect((thrown as Error).message).toContain(`cannot take the server's lock ${join(t.dir, "serve.lock")}`);
});
