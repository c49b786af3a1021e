import { Database } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { takeBackup } from "../../src/cli/backup.ts";
import { restoreBackup, type TargetWrites } from "../../src/cli/restore.ts";
import { resolveConfig } from "../../src/config.ts";
import { Keystore } from "../../src/crypto/keystore.ts";
import { expectCliError, reseal } from "../support/backup.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * Restores that did not finish, and what comes after them: whatever stopped a restore, the data
 * dir must never pass for a fresh one (serve would initialise a blank install there), and the
 * operator must be able to run the restore again.
 */
const PASSPHRASE = "test passphrase";
const ENV = { LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE };
let t: TestContext;
let scratch: string;
let backup: string;

beforeEach(async () => {
  t = createTestContext();
  scratch = mkdtempSync(join(tmpdir(), "licensing-restore-"));
  await seedLicense();
  backup = join(scratch, "backup");
  takeBackup(resolveConfig({ "data-dir": t.dir }, ENV, scratch), backup, { includePassphrase: false });
});
afterEach(() => {
  t.close();
  rmSync(scratch, { recursive: true, force: true });
});

/** A product, a policy and a license: the store then holds an encrypted license key. */
async function seedLicense(): Promise<string> {
  const product = await t.call("POST", "/mgmt/v1/products", {
    body: { name: "Desk", code: "desk", environment: "live" },
    headers: t.idem(),
  });
  const policy = await t.call("POST", "/mgmt/v1/policies", {
    body: { product_id: product.body.data.public_id, name: "Std" },
    headers: t.idem(),
  });
  const license = await t.call("POST", "/mgmt/v1/licenses", {
    body: { product_id: product.body.data.public_id, policy_id: policy.body.data.public_id },
    headers: t.idem(),
  });
  expect(license.status).toBe(201);
  return license.body.data.public_id;
}

/** Changes the backup's store with foreign keys off, as a hand outside the service would. */
function alterStore(dir: string, sql: string): void {
  const sqlite = new Database(join(dir, "licensing.db"));
  try {
    sqlite.run("PRAGMA foreign_keys = OFF");
    sqlite.run(sql);
  } finally {
    sqlite.close();
  }
  reseal(dir);
}

const configFor = (dataDir: string, env: Record<string, string> = ENV) =>
  resolveConfig({ "data-dir": dataDir }, env, scratch);

/** The data dir as a restore leaves it when it is killed while checking the backup in staging. */
function interruptedRestore(name: string): string {
  const dataDir = join(scratch, name);
  const staging = join(dataDir, ".restore-Kx3pQa");
  mkdirSync(staging, { recursive: true });
  copyFileSync(join(backup, "licensing.db"), join(staging, "licensing.db"));
  copyFileSync(join(backup, "keystore.json"), join(staging, "keystore.json"));
  return dataDir;
}

describe("after a restore that did not finish", () => {
  test("init refuses the data dir, names the staging folder and creates nothing", async () => {
    const dataDir = interruptedRestore("d");
    const init = await runInProcess(["init", "--data-dir", "d"], scratch, ENV);
    expect(init.code).toBe(1);
    expect(init.stderr).toBe(
      `licensing init: a restore into ${dataDir} did not finish (it left ${join(dataDir, ".restore-Kx3pQa")}); ` +
        "run the restore again, which removes that folder first, or delete the folder to use the directory without the backup\n",
    );
    expect(init.stdout).not.toContain("lsk_");
    expect(readdirSync(dataDir)).toEqual([".restore-Kx3pQa"]);
  });

  test("the restore run again removes the staging folder it left, and a retry that is refused too keeps it", async () => {
    const dataDir = interruptedRestore("d");
    // A retry that is itself refused leaves the folder, so serve still refuses the directory.
    expectCliError(
      () =>
        restoreBackup(configFor(dataDir, { LICENSING_KEYSTORE_PASSPHRASE: "another passphrase" }), backup),
      /passphrase is wrong/,
    );
    expect(readdirSync(dataDir)).toEqual([".restore-Kx3pQa"]);

    const retry = await runInProcess(["restore", "backup", "--data-dir", "d"], scratch, ENV);
    expect(retry.code).toBe(0);
    expect(retry.stderr).toBe(
      `Removed ${join(dataDir, ".restore-Kx3pQa")}, left by an earlier restore that did not finish.\n`,
    );
    expect(readdirSync(dataDir).sort()).toEqual(["keystore.json", "licensing.db"]);
  });

  test("a restore that died while putting files in place is not cleared: restore names what is there and asks for an empty directory", () => {
    const dataDir = interruptedRestore("d");
    copyFileSync(join(backup, "licensing.db"), join(dataDir, "licensing.db"));
    writeFileSync(join(dataDir, "notes.txt"), "kept");
    expectCliError(
      () => restoreBackup(configFor(dataDir), backup),
      /is not empty: it holds licensing\.db, notes\.txt beside \.restore-Kx3pQa, left by a restore that did not finish; .*empty the directory and restore again$/,
    );
    expect(readdirSync(dataDir).sort()).toEqual([".restore-Kx3pQa", "licensing.db", "notes.txt"]);
  });
});

/** What a write on a full volume throws. */
const noSpace = () =>
  Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", syscall: "write" });

/**
 * The file-system calls restore writes the target with, failing as on a full disk: the file is
 * written up to half and then the write fails. A tmpfs of the right size would need root.
 */
const fullDisk = (which: keyof TargetWrites): TargetWrites => ({
  copyFile: (from, to) => {
    if (which !== "copyFile") return copyFileSync(from, to);
    const bytes = readFileSync(from);
    writeFileSync(to, bytes.subarray(0, bytes.length >> 1));
    throw noSpace();
  },
  writeFile: (path, data) => {
    if (which !== "writeFile") return writeFileSync(path, data);
    writeFileSync(path, String(data).slice(0, 3));
    throw noSpace();
  },
});

describe("a restore that runs out of space", () => {
  test("while copying the store into place removes the half-written store, and the restore run again succeeds", () => {
    const target = join(scratch, "d");
    expectCliError(
      () => restoreBackup(configFor(target), backup, fullDisk("copyFile")),
      /^cannot put the restored files into .*: ENOSPC: no space left on device, write; nothing of this restore was left there: make room \(restore needs about twice the store's size free\) and run it again$/,
    );
    expect(readdirSync(target)).toEqual([]);
    restoreBackup(configFor(target), backup);
    expect(readdirSync(target).sort()).toEqual(["keystore.json", "licensing.db"]);
  });

  test("while writing the passphrase from the backup takes out the store and keystore it had put in place", () => {
    const withPassphrase = join(scratch, "with-passphrase");
    takeBackup(configFor(t.dir), withPassphrase, { includePassphrase: true });
    const target = join(scratch, "d");
    expectCliError(
      () => restoreBackup(configFor(target, {}), withPassphrase, fullDisk("writeFile")),
      /^cannot put the restored files into .*: ENOSPC/,
    );
    expect(readdirSync(target)).toEqual([]);
    restoreBackup(configFor(target, {}), withPassphrase);
    expect(readFileSync(join(target, "keystore.passphrase"), "utf8")).toBe(`${PASSPHRASE}\n`);
  });
});

describe("a backup whose parts do not belong together", () => {
  test("is refused when the keystore opens but its data key does not decrypt the store's license keys, though the store lists no signing key it lacks", () => {
    // The store's signing keys gone, so the check that the keystore holds them passes.
    alterStore(backup, "DELETE FROM signing_keys");
    rmSync(join(backup, "keystore.json"));
    Keystore.create(join(backup, "keystore.json"), PASSPHRASE, { scryptN: 1024 });
    reseal(backup);
    const target = join(scratch, "d");
    expectCliError(
      () => restoreBackup(configFor(target), backup),
      /^the backup's store cannot be used: the keystore's data key does not decrypt the store's secrets \(licenses\.key_ciphertext of lic_\w+\); the two do not belong together$/,
    );
    expect(readdirSync(target)).toEqual([]);
  });

  test("is refused when a row refers to a row the store does not hold", () => {
    alterStore(backup, "DELETE FROM products");
    const target = join(scratch, "d");
    expectCliError(
      () => restoreBackup(configFor(target), backup),
      /^the backup's store cannot be used: the store is damaged: \d+ row\(s\) refer to rows it does not hold \(the first: row \d+ of \w+, whose products row is missing\)$/,
    );
    expect(readdirSync(target)).toEqual([]);
  });
});
