import { Database } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { takeBackup } from "../../src/cli/backup.ts";
import { restoreBackup, serveHint } from "../../src/cli/restore.ts";
import { resolvePassphrase } from "../../src/cli/secrets.ts";
import { serveCommand } from "../../src/cli/serve.ts";
import { parseCommandLine, resolveConfig } from "../../src/config.ts";
import { Keystore } from "../../src/crypto/keystore.ts";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import { describeFile } from "../../src/store/backup.ts";
import { expectCliError, reseal } from "../support/backup.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * `licensing backup` and `licensing restore` in-process, over a real store and keystore. The
 * end-to-end test (test/e2e/backup.test.ts) takes one from the executable while it is under load.
 */
const PASSPHRASE = "test passphrase";
let t: TestContext;
let scratch: string;

beforeEach(() => {
  t = createTestContext();
  scratch = mkdtempSync(join(tmpdir(), "licensing-backup-"));
});
afterEach(() => {
  t.close();
  rmSync(scratch, { recursive: true, force: true });
});

const configFor = (
  dataDir: string,
  env: Record<string, string> = { LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE },
) => resolveConfig({ "data-dir": dataDir }, env, scratch);

async function seed() {
  const product = await t.call("POST", "/mgmt/v1/products", {
    body: { name: "Desk", code: `desk-${Math.random().toString(36).slice(2, 8)}`, environment: "live" },
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
  return { productId: product.body.data.public_id as string, license: license.body.data };
}

function rowsOf(path: string, sql: string) {
  const db = new Database(path, { readonly: true });
  try {
    return db.query(sql).all();
  } finally {
    db.close();
  }
}

describe("backup", () => {
  test("writes the store, the keystore and a manifest whose checksums and row counts match", async () => {
    await seed();
    const out = join(scratch, "backup");
    const { manifest } = takeBackup(configFor(t.dir), out, { includePassphrase: false });
    expect(readdirSync(out).sort()).toEqual(["backup.json", "keystore.json", "licensing.db"]);
    expect(manifest.files["licensing.db"]).toEqual(describeFile(join(out, "licensing.db")));
    expect(manifest.files["keystore.json"]).toEqual(describeFile(join(out, "keystore.json")));
    expect(manifest.rows.licenses).toBe(1);
    expect(manifest.rows.products).toBe(1);
    expect(manifest.schema).toEqual(
      t.deps.sqlite
        .query<{ tag: string }, []>("SELECT tag FROM schema_migrations ORDER BY tag")
        .all()
        .map((r) => r.tag),
    );
    expect(manifest.passphrase_included).toBe(false);
    // The snapshot is one self-contained file: no WAL beside it, readable on its own.
    expect(rowsOf(join(out, "licensing.db"), "PRAGMA journal_mode")).toEqual([{ journal_mode: "delete" }]);
  });

  test("includes the passphrase only when asked", async () => {
    const out = join(scratch, "with-passphrase");
    takeBackup(configFor(t.dir), out, { includePassphrase: true });
    expect(readFileSync(join(out, "keystore.passphrase"), "utf8")).toBe(`${PASSPHRASE}\n`);
  });

  test("refuses a non-empty output directory and leaves no partial folder behind", () => {
    const out = join(scratch, "taken");
    mkdirSync(out);
    writeFileSync(join(out, "precious"), "x");
    expectCliError(() => takeBackup(configFor(t.dir), out, { includePassphrase: false }), /not an empty/);
    expect(readdirSync(out)).toEqual(["precious"]);
    expect(readdirSync(scratch)).toEqual(["taken"]);
  });

  test("into OUT/ with a trailing slash writes OUT, whether OUT is new or an empty directory", async () => {
    const env = { LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE };
    const fresh = await runInProcess(["backup", "new/", "--data-dir", t.dir], scratch, env);
    expect([fresh.code, fresh.stdout]).toEqual([
      0,
      expect.stringContaining(`Backup written to ${join(scratch, "new")}:`),
    ]);
    mkdirSync(join(scratch, "empty"));
    const empty = await runInProcess(
      ["backup", `${join(scratch, "empty")}//`, "--data-dir", t.dir, "--json"],
      scratch,
      env,
    );
    expect(empty.code).toBe(0);
    expect(JSON.parse(empty.stdout).backup_dir).toBe(join(scratch, "empty"));
    for (const out of ["new", "empty"]) {
      expect(readdirSync(join(scratch, out)).sort()).toEqual([
        "backup.json",
        "keystore.json",
        "licensing.db",
      ]);
    }
    expect(readdirSync(scratch).sort()).toEqual(["empty", "new"]);
  });

  test("refuses an OUT in the data directory, by any spelling or link, with one line and writes nothing there", async () => {
    const env = { LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE };
    const before = readdirSync(t.dir).sort();
    symlinkSync(t.dir, join(scratch, "data-link"));
    const attempts = [
      // Names that would break the install: serve refuses a .restore-* folder, keystore writes
      // wait forever on a keystore.json.lock directory.
      { out: join(t.dir, ".restore-nightly"), dataDir: t.dir },
      { out: join(t.dir, "keystore.json.lock"), dataDir: t.dir },
      { out: join(t.dir, "not", "yet", "there"), dataDir: t.dir },
      { out: t.dir, dataDir: t.dir },
      { out: join(scratch, "data-link", "nightly"), dataDir: t.dir },
      { out: join(t.dir, "nightly"), dataDir: join(scratch, "data-link") },
    ];
    for (const { out, dataDir } of attempts) {
      const result = await runInProcess(["backup", out, "--data-dir", dataDir], scratch, env);
      expect(result).toEqual({
        code: 1,
        stdout: "",
        stderr: `licensing backup: cannot write the backup to ${out}: it is in the data directory ${dataDir}, which holds only the service's own files\n`,
      });
    }
    expect(readdirSync(t.dir).sort()).toEqual(before);
    expect(readdirSync(scratch)).toEqual(["data-link"]);
  });

  test("with the wrong passphrase fails, because the keystore copy cannot be verified", () => {
    const out = join(scratch, "wrong");
    expectCliError(
      () =>
        takeBackup(configFor(t.dir, { LICENSING_KEYSTORE_PASSPHRASE: "not the passphrase" }), out, {
          includePassphrase: false,
        }),
      /passphrase is wrong/,
    );
    expect(existsSync(out)).toBe(false);
    expect(readdirSync(scratch)).toEqual([]);
  });
});

describe("restore", () => {
  test("brings back every row, and license keys decrypt with the restored keystore", async () => {
    const { license } = await seed();
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    const target = join(scratch, "restored");
    const result = restoreBackup(configFor(target), out);
    expect(result.applied).toEqual([]);
    expect(result.passphraseFile).toBeNull();
    const tables = ["products", "policies", "licenses", "signing_keys", "api_keys", "audit_events"];
    for (const table of tables) {
      expect(rowsOf(join(target, "licensing.db"), `SELECT * FROM ${table} ORDER BY 1`)).toEqual(
        t.deps.sqlite.query(`SELECT * FROM ${table} ORDER BY 1`).all(),
      );
    }
    const keystore = Keystore.open(join(target, "keystore.json"), PASSPHRASE);
    const [row] = rowsOf(
      join(target, "licensing.db"),
      `SELECT key_ciphertext FROM licenses WHERE id = '${license.public_id}'`,
    ) as { key_ciphertext: string }[];
    const secrets = new SecretBox(keystore.secret("data-key"));
    expect(secrets.decrypt(row?.key_ciphertext ?? "", `license-key:${license.public_id}`)).toBe(
      license.key.replaceAll("-", ""),
    );
  });

  test("takes the passphrase from the backup when it holds one, and leaves it where serve looks", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: true });
    const target = join(scratch, "restored");
    const result = restoreBackup(configFor(target, {}), out);
    expect(result.passphraseFile).toBe(join(target, "keystore.passphrase"));
    expect(readFileSync(join(target, "keystore.passphrase"), "utf8")).toBe(`${PASSPHRASE}\n`);
  });

  test("refuses a backup whose passphrase file is empty or past 64 KiB, before anything is restored", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: true });
    for (const [content, message] of [
      ["\n", /the backup's passphrase file is empty/],
      ["p".repeat(64 * 1024 + 1), /the backup's passphrase file is larger than 64 KiB/],
    ] as const) {
      writeFileSync(join(out, "keystore.passphrase"), content, { mode: 0o600 });
      reseal(out);
      const target = join(scratch, `restored-${content.length}`);
      expectCliError(() => restoreBackup(configFor(target, {}), out), message);
      expect(existsSync(target)).toBe(false);
    }
  });

  test("prints a serve command that finds the passphrase when the backup held none", async () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    writeFileSync(join(scratch, "pass"), `${PASSPHRASE}\n`, { mode: 0o600 });
    const restore = await runInProcess(
      ["restore", "backup", "--data-dir", "r1", "--passphrase-file", "pass"],
      scratch,
    );
    expect(restore.code).toBe(0);
    const hint = restore.stdout.split("Start it with: ")[1]?.trim() ?? "";
    expect(hint).toBe(
      `licensing serve --data-dir ${join(scratch, "r1")} --passphrase-file ${join(scratch, "pass")}`,
    );
    // The printed command, run from anywhere, opens the keystore: serve would start.
    const serve = parseCommandLine(hint.split(" ").slice(2), {}, "/", serveCommand.configKeys);
    expect(resolvePassphrase(serve.config).passphrase).toBe(PASSPHRASE);
  });

  test("names the passphrase variable when restore took the passphrase from it, and only the data dir when restored", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: true });
    const fromEnv = configFor(join(scratch, "a"));
    expect(serveHint(restoreBackup(fromEnv, out), fromEnv)).toBe(
      `licensing serve --data-dir ${join(scratch, "a")} (with LICENSING_KEYSTORE_PASSPHRASE set, as for this restore)`,
    );
    const restored = configFor(join(scratch, "b c"), {});
    expect(serveHint(restoreBackup(restored, out), restored)).toBe(
      `licensing serve --data-dir '${join(scratch, "b c")}'`,
    );
  });

  test("needs the data dir named by --data-dir or LICENSING_DATA_DIR: without either it is a usage error and nothing lands in ./data", async () => {
    takeBackup(configFor(t.dir), join(scratch, "backup"), { includePassphrase: true });
    const unnamed = await runInProcess(["restore", "backup"], scratch);
    expect(unnamed).toEqual({
      code: 2,
      stdout: "",
      stderr:
        "licensing restore: --data-dir (or LICENSING_DATA_DIR) is required: the new or empty directory to restore into\n" +
        'Run "licensing restore --help" for its options.\n',
    });
    expect(existsSync(join(scratch, "data"))).toBe(false);
    const named = await runInProcess(["restore", "backup"], scratch, { LICENSING_DATA_DIR: "named" });
    expect([named.code, named.stderr]).toEqual([0, ""]);
    expect(existsSync(join(scratch, "named", "licensing.db"))).toBe(true);
  });

  test("takes IN/ and --data-dir D/ with trailing slashes, and names D without one", async () => {
    takeBackup(configFor(t.dir), join(scratch, "backup"), { includePassphrase: false });
    const restore = await runInProcess(["restore", "backup/", "--data-dir", "restored/", "--json"], scratch, {
      LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE,
    });
    expect([restore.code, restore.stderr]).toEqual([0, ""]);
    expect(JSON.parse(restore.stdout).data_dir).toBe(join(scratch, "restored"));
    expect(readdirSync(join(scratch, "restored")).sort()).toEqual(["keystore.json", "licensing.db"]);
  });

  test("says it is the backup's store that is damaged, whether it is not SQLite or its pages are malformed", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    const store = readFileSync(join(out, "licensing.db"));
    const damages: [string, Buffer, string][] = [
      [
        "not-sqlite",
        Buffer.alloc(store.length, 0x41),
        "the backup's store is not a SQLite database; restore another backup",
      ],
      // The schema page overwritten past the 100-byte file header.
      [
        "schema-page",
        Buffer.concat([store.subarray(0, 100), Buffer.alloc(4000, 0x41), store.subarray(4100)]),
        "the backup's store cannot be used: database disk image is malformed",
      ],
      // A page size SQLite does not accept.
      [
        "page-size",
        Buffer.concat([store.subarray(0, 16), Buffer.from([0, 3]), store.subarray(18)]),
        "the backup's store cannot be used: file is not a database",
      ],
    ];
    for (const [name, bytes, message] of damages) {
      writeFileSync(join(out, "licensing.db"), bytes);
      reseal(out);
      const target = join(scratch, name);
      let thrown: unknown;
      try {
        restoreBackup(configFor(target), out);
      } catch (error) {
        thrown = error;
      }
      expect((thrown as Error).message).toBe(message);
      expect(readdirSync(target)).toEqual([]);
    }
  });

  test("accepts a target whose only entry is the empty lost+found of a freshly formatted volume, and leaves it there", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    const target = join(scratch, "volume");
    mkdirSync(join(target, "lost+found"), { recursive: true });
    restoreBackup(configFor(target), out);
    expect(readdirSync(target).sort()).toEqual(["keystore.json", "licensing.db", "lost+found"]);
    expect(readdirSync(join(target, "lost+found"))).toEqual([]);
  });

  test("accepts a target whose only entry is the keystore's empty lock file, and refuses one whose lock file holds something", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    const target = join(scratch, "emptied");
    mkdirSync(target);
    writeFileSync(join(target, "keystore.json.lock"), "");
    restoreBackup(configFor(target), out);
    expect(readdirSync(target).sort()).toEqual(["keystore.json", "keystore.json.lock", "licensing.db"]);

    const written = join(scratch, "written");
    mkdirSync(written);
    writeFileSync(join(written, "keystore.json.lock"), "not a lock");
    expectCliError(
      () => restoreBackup(configFor(written), out),
      /is not empty; restore only into a new or empty directory/,
    );
    expect(readdirSync(written)).toEqual(["keystore.json.lock"]);
  });

  test("refuses a target whose lost+found holds files, or is not a directory, or sits beside other files", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    const filled = join(scratch, "filled");
    mkdirSync(join(filled, "lost+found"), { recursive: true });
    writeFileSync(join(filled, "lost+found", "#1234"), "recovered by fsck");
    const file = join(scratch, "file");
    mkdirSync(file);
    writeFileSync(join(file, "lost+found"), "");
    const linked = join(scratch, "linked");
    mkdirSync(linked);
    mkdirSync(join(scratch, "elsewhere"));
    symlinkSync(join(scratch, "elsewhere"), join(linked, "lost+found"));
    const beside = join(scratch, "beside");
    mkdirSync(join(beside, "lost+found"), { recursive: true });
    writeFileSync(join(beside, "notes"), "");
    for (const target of [filled, file, linked, beside]) {
      const before = readdirSync(target).sort();
      expectCliError(
        () => restoreBackup(configFor(target), out),
        /is not empty; restore only into a new or empty directory/,
      );
      expect(readdirSync(target).sort()).toEqual(before);
    }
  });

  test("refuses a non-empty target and leaves it as it was", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    const target = join(scratch, "busy");
    mkdirSync(target);
    writeFileSync(join(target, "licensing.db"), "someone else's store");
    expectCliError(() => restoreBackup(configFor(target), out), /not empty/);
    expect(readdirSync(target)).toEqual(["licensing.db"]);
    expect(readFileSync(join(target, "licensing.db"), "utf8")).toBe("someone else's store");
  });

  test("refuses a backup whose files do not match the manifest", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    const bytes = readFileSync(join(out, "licensing.db"));
    bytes[bytes.length - 1] = (bytes[bytes.length - 1] ?? 0) ^ 0xff;
    writeFileSync(join(out, "licensing.db"), bytes);
    const target = join(scratch, "restored");
    expectCliError(() => restoreBackup(configFor(target), out), /does not match its checksum/);
    expect(existsSync(target)).toBe(false);
  });

  test("refuses a manifest that names a file outside the backup", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    const manifest = JSON.parse(readFileSync(join(out, "backup.json"), "utf8"));
    manifest.files["../escape"] = manifest.files["keystore.json"];
    writeFileSync(join(out, "backup.json"), JSON.stringify(manifest));
    expectCliError(() => restoreBackup(configFor(join(scratch, "restored")), out), /unknown file/);
  });

  test("with the wrong passphrase is refused and leaves the target empty", () => {
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    const target = join(scratch, "restored");
    expectCliError(
      () => restoreBackup(configFor(target, { LICENSING_KEYSTORE_PASSPHRASE: "another passphrase" }), out),
      /passphrase is wrong/,
    );
    expect(readdirSync(target)).toEqual([]);
  });

  test("refuses a store whose signing keys are missing from the keystore beside it", async () => {
    // A keystore copied before the store snapshot, as a careless hand-made backup would be.
    const early = join(scratch, "early");
    takeBackup(configFor(t.dir), early, { includePassphrase: false });
    await seed();
    const late = join(scratch, "late");
    takeBackup(configFor(t.dir), late, { includePassphrase: false });
    writeFileSync(join(late, "keystore.json"), readFileSync(join(early, "keystore.json")));
    reseal(late);
    const target = join(scratch, "restored");
    expectCliError(
      () => restoreBackup(configFor(target), late),
      /lacks the private half of key\(s\) product-signing:/,
    );
    expect(readdirSync(target)).toEqual([]);
  });

  test("refuses a backup of a store migrated by a newer version", () => {
    t.deps.sqlite.run("INSERT INTO schema_migrations (tag, hash, applied_at) VALUES ('9999_future', 'x', 0)");
    const out = join(scratch, "backup");
    takeBackup(configFor(t.dir), out, { includePassphrase: false });
    expectCliError(() => restoreBackup(configFor(join(scratch, "restored")), out), /newer version/);
  });
});
