import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Keystore } from "../../src/crypto/keystore.ts";
import { WorkspaceService } from "../../src/modules/workspace/service.ts";
import { buildDeps, openKeystore } from "../../src/server.ts";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * A passphrase from LICENSING_KEYSTORE_PASSPHRASE is used byte for byte, while a passphrase file
 * loses its trailing line break. A passphrase that ends in CR or LF (a Kubernetes or systemd
 * secret with its newline) cannot live in a file: init refuses it for a new keystore, a keystore
 * sealed with one before keeps opening from the variable, and a backup that would hold it in a
 * file is refused instead of being written unrestorable.
 */
const work = mkdtempSync(join(tmpdir(), "passphrase-line-break-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const WITH_NEWLINE = "correct horse battery staple\n";
let made = 0;
const fresh = (name: string) => join(work, `${name}-${made++}`);

/** A data dir as init made it before it refused such a passphrase: keystore, store, workspace. */
function installSealedWith(passphrase: string): string {
  const dataDir = fresh("sealed");
  mkdirSync(dataDir, { mode: 0o700 });
  const keystore = Keystore.create(join(dataDir, "keystore.json"), passphrase, { scryptN: 1024 });
  const store = openStore(join(dataDir, "licensing.db"));
  try {
    migrate(store.sqlite);
    new WorkspaceService(buildDeps(store, keystore)).ensure();
  } finally {
    store.close();
  }
  return dataDir;
}

describe("a new keystore's passphrase from LICENSING_KEYSTORE_PASSPHRASE", () => {
  for (const ending of ["\n", "\r\n", "\r"]) {
    test(`init refuses one that ends in ${JSON.stringify(ending)} with one line, and writes no keystore`, async () => {
      const dataDir = fresh("init");
      const result = await runInProcess(["init", "--data-dir", dataDir, "--json"], work, {
        LICENSING_KEYSTORE_PASSPHRASE: `correct horse battery staple${ending}`,
      });
      expect(result.code).toBe(1);
      expect(result.stdout).toBe("");
      expect(result.stderr).toBe(
        "licensing init: LICENSING_KEYSTORE_PASSPHRASE ends in a line break (CR or LF), which a passphrase file cannot hold; " +
          "set it without the trailing line break, or give the passphrase in LICENSING_KEYSTORE_PASSPHRASE_FILE\n",
      );
      expect(existsSync(join(dataDir, "keystore.json"))).toBe(false);
      expect(existsSync(join(dataDir, "licensing.db"))).toBe(false);
    });
  }

  test("serve refuses it too before initialising an empty data dir, and nothing listens", async () => {
    const dataDir = fresh("serve");
    const serve = runInProcess(
      ["serve", "--data-dir", dataDir, "--port", String(20_000 + Math.floor(Math.random() * 20_000))],
      work,
      {
        LICENSING_KEYSTORE_PASSPHRASE: WITH_NEWLINE,
      },
    );
    const outcome = await Promise.race([serve, Bun.sleep(10_000).then(() => null)]);
    if (outcome === null) process.emit("SIGTERM");
    expect(outcome?.code).toBe(1);
    expect(outcome?.stderr).toStartWith(
      "licensing serve: LICENSING_KEYSTORE_PASSPHRASE ends in a line break",
    );
    expect(existsSync(join(dataDir, "keystore.json"))).toBe(false);
  });

  test("a line break inside the passphrase is kept and accepted", async () => {
    const dataDir = fresh("inside");
    const passphrase = "correct horse\nbattery staple";
    const result = await runInProcess(["init", "--data-dir", dataDir, "--json"], work, {
      LICENSING_KEYSTORE_PASSPHRASE: passphrase,
    });
    expect(result.code).toBe(0);
    expect(() => openKeystore(dataDir, passphrase)).not.toThrow();
  });

  test("a keystore sealed with one before keeps opening with it from the variable", async () => {
    const dataDir = installSealedWith(WITH_NEWLINE);
    const result = await runInProcess(
      ["signing-keys", "list", "--product", "prod_x", "--data-dir", dataDir],
      work,
      {
        LICENSING_KEYSTORE_PASSPHRASE: WITH_NEWLINE,
      },
    );
    expect(result.stderr).not.toContain("passphrase");
    expect(result.stderr).toContain("prod_x");
  });
});

describe("backup --include-passphrase", () => {
  test("of a keystore sealed with a passphrase that ends in a line break fails with one line and leaves no backup", async () => {
    const dataDir = installSealedWith(WITH_NEWLINE);
    const parent = fresh("backups");
    mkdirSync(parent);
    const result = await runInProcess(
      ["backup", join(parent, "nightly"), "--data-dir", dataDir, "--include-passphrase"],
      work,
      { LICENSING_KEYSTORE_PASSPHRASE: WITH_NEWLINE },
    );
    expect(result.code).toBe(1);
    expect(result.stdout).toBe("");
    expect(result.stderr).toBe(
      "licensing backup: cannot include the passphrase: the passphrase ends in a line break (CR or LF), which a passphrase file cannot hold, " +
        "so restore could not open this backup; run the backup without --include-passphrase and keep the passphrase, exactly as it is, elsewhere\n",
    );
    expect(readdirSync(parent)).toEqual([]);
  });

  test("of the same keystore without the passphrase is written, and restores with the passphrase from the variable", async () => {
    const dataDir = installSealedWith(WITH_NEWLINE);
    const env = { LICENSING_KEYSTORE_PASSPHRASE: WITH_NEWLINE };
    const out = fresh("plain");
    const backup = await runInProcess(["backup", out, "--data-dir", dataDir], work, env);
    expect(backup.code).toBe(0);
    const restore = await runInProcess(["restore", out, "--data-dir", fresh("restored")], work, env);
    expect([restore.code, restore.stderr]).toEqual([0, ""]);
  });

  test("writes a passphrase file that restore reads and opens the backup's keystore with", async () => {
    const passphrase = "correct horse battery staple";
    const dataDir = fresh("good");
    const env = { LICENSING_KEYSTORE_PASSPHRASE: passphrase };
    expect((await runInProcess(["init", "--data-dir", dataDir, "--json"], work, env)).code).toBe(0);
    const out = fresh("with-passphrase");
    const backup = await runInProcess(
      ["backup", out, "--data-dir", dataDir, "--include-passphrase"],
      work,
      env,
    );
    expect(backup.code).toBe(0);
    const target = fresh("restored");
    const restore = await runInProcess(["restore", out, "--data-dir", target], work, {});
    expect([restore.code, restore.stderr]).toEqual([0, ""]);
    expect(() => openKeystore(target, passphrase)).not.toThrow();
  });
});
