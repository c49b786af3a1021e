import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import pkg from "../../package.json" with { type: "json" };
import {
  BUILD_TIMEOUT_MS,
  executable,
  isListening,
  removeTempDirs,
  runCli,
  runServeToExit,
  tempDir,
} from "./binary.ts";

beforeAll(() => {
  executable();
}, BUILD_TIMEOUT_MS);
afterAll(removeTempDirs);

const KEY = /^lsk_(live|test)_[0-9A-Za-z]{32}$/;

async function initialised(env: Record<string, string> = {}) {
  const dataDir = join(tempDir(), "data");
  const result = await runCli(["init", "--data-dir", dataDir, "--json"], { env });
  expect(result.exitCode).toBe(0);
  return { dataDir, out: JSON.parse(result.stdout) };
}

describe("init", () => {
  test("init --json prints exactly the data dir, both API keys and the passphrase file", async () => {
    const cwd = tempDir();
    const result = await runCli(["init", "--json"], { cwd });
    expect(result.exitCode).toBe(0);
    const out = JSON.parse(result.stdout);
    expect(Object.keys(out).sort()).toEqual(["api_keys", "data_dir", "passphrase_file"]);
    expect(Object.keys(out.api_keys).sort()).toEqual(["live", "test"]);
    expect(out.data_dir).toBe(join(cwd, "data"));
    expect(out.api_keys.live).toMatch(KEY);
    expect(out.api_keys.live.startsWith("lsk_live_")).toBe(true);
    expect(out.api_keys.test.startsWith("lsk_test_")).toBe(true);
    expect(out.passphrase_file).toBe(join(cwd, "data", "keystore.passphrase"));
    expect(result.stdout.trim().split("\n")).toHaveLength(1);
    expect(result.stderr).toContain("move it elsewhere for production");
  });

  test("the generated passphrase, keystore and data dir are private to the owner", async () => {
    const { dataDir } = await initialised();
    expect(statSync(dataDir).mode & 0o777).toBe(0o700);
    expect(statSync(join(dataDir, "keystore.passphrase")).mode & 0o777).toBe(0o600);
    expect(statSync(join(dataDir, "keystore.json")).mode & 0o777).toBe(0o600);
    // serve.lock: init holds the server's lock while it sets the directory up (the empty file stays).
    expect(readdirSync(dataDir).sort()).toEqual([
      "keystore.json",
      "keystore.passphrase",
      "licensing.db",
      "serve.lock",
    ]);
  });

  test("a passphrase from the environment is used and no passphrase file is written", async () => {
    const { dataDir, out } = await initialised({ LICENSING_KEYSTORE_PASSPHRASE: "an operator's passphrase" });
    expect(out.passphrase_file).toBeNull();
    expect(existsSync(join(dataDir, "keystore.passphrase"))).toBe(false);
  });

  test("a passphrase file given by flag is reported and not copied into the data dir", async () => {
    const dir = tempDir();
    const file = join(dir, "passphrase");
    writeFileSync(file, "a passphrase kept elsewhere\n", { mode: 0o600 });
    const result = await runCli([
      "init",
      "--data-dir",
      join(dir, "data"),
      "--passphrase-file",
      file,
      "--json",
    ]);
    expect(result.exitCode).toBe(0);
    expect(JSON.parse(result.stdout).passphrase_file).toBe(file);
    expect(existsSync(join(dir, "data", "keystore.passphrase"))).toBe(false);
  });

  test("a short passphrase is refused before anything is created", async () => {
    const dataDir = join(tempDir(), "data");
    const result = await runCli(["init", "--data-dir", dataDir], {
      env: { LICENSING_KEYSTORE_PASSPHRASE: "short" },
    });
    expect(result.exitCode).toBe(1);
    expect(result.stderr).toContain("at least 12 characters");
    expect(existsSync(join(dataDir, "keystore.json"))).toBe(false);
  });

  test("init on an initialised data dir fails and leaves the keystore untouched", async () => {
    const { dataDir } = await initialised();
    const before = readFileSync(join(dataDir, "keystore.json"), "utf8");
    const result = await runCli(["init", "--data-dir", dataDir]);
    expect(result.exitCode).toBe(1);
    expect(result.stderr).toContain("already initialised");
    expect(result.stderr).not.toContain("    at ");
    expect(readFileSync(join(dataDir, "keystore.json"), "utf8")).toBe(before);
  });
});

describe("keys and plan commands", () => {
  test("keys create, list and revoke work on a data dir", async () => {
    const { dataDir } = await initialised();
    const created = await runCli([
      "keys",
      "create",
      "--data-dir",
      dataDir,
      "--env",
      "test",
      "--scopes",
      "products:read,licenses:read",
      "--name",
      "ci",
      "--json",
    ]);
    expect(created.exitCode).toBe(0);
    const key = JSON.parse(created.stdout);
    expect(Object.keys(key).sort()).toEqual(["api_key", "id"]);
    expect(key.api_key).toMatch(/^lsk_test_/);
    expect(key.id).toMatch(/^key_/);

    const listed = await runCli(["keys", "list", "--data-dir", dataDir, "--json"]);
    expect(listed.exitCode).toBe(0);
    const keys = JSON.parse(listed.stdout);
    expect(keys).toHaveLength(3);
    const mine = keys.find((k: { id: string }) => k.id === key.id);
    expect(mine).toMatchObject({
      name: "ci",
      environment: "test",
      scopes: ["products:read", "licenses:read"],
    });
    expect(mine.revoked_at).toBeNull();
    expect(listed.stdout).not.toContain(key.api_key);

    const revoked = await runCli(["keys", "revoke", key.id, "--data-dir", dataDir]);
    expect(revoked.exitCode).toBe(0);
    const after = JSON.parse((await runCli(["keys", "list", "--data-dir", dataDir, "--json"])).stdout);
    expect(after.find((k: { id: string }) => k.id === key.id).revoked_at).not.toBeNull();

    const human = await runCli(["keys", "list", "--data-dir", dataDir]);
    expect(human.stdout).toContain(key.id);
    expect(human.stdout).toContain("revoked");
  });

  test("revoking an unknown key fails with exit code 1", async () => {
    const { dataDir } = await initialised();
    const result = await runCli(["keys", "revoke", "key_01ARZ3NDEKTSV4RRFFQ69G5FAV", "--data-dir", dataDir]);
    expect(result.exitCode).toBe(1);
    expect(result.stderr).toContain("no API key");
  });

  test("an unknown scope is a usage error that lists the valid scopes", async () => {
    const { dataDir } = await initialised();
    const result = await runCli([
      "keys",
      "create",
      "--data-dir",
      dataDir,
      "--env",
      "live",
      "--scopes",
      "root",
    ]);
    expect(result.exitCode).toBe(2);
    expect(result.stderr).toContain("unknown scope root");
    expect(result.stderr).toContain("licenses:write");
  });

  test("plan show and plan set read and change the workspace plan", async () => {
    const { dataDir } = await initialised();
    const shown = await runCli(["plan", "show", "--data-dir", dataDir, "--json"]);
    expect(shown.exitCode).toBe(0);
    expect(JSON.parse(shown.stdout).code).toBe("self_hosted");

    expect((await runCli(["plan", "set", "business", "--data-dir", dataDir])).exitCode).toBe(0);
    const after = await runCli(["plan", "show", "--data-dir", dataDir, "--json"]);
    expect(JSON.parse(after.stdout)).toMatchObject({ code: "business", name: "Business" });
    expect((await runCli(["plan", "show", "--data-dir", dataDir])).stdout).toContain("Plan: business");
  });

  test("plan set with an unknown code fails with exit code 2 and lists the codes", async () => {
    const { dataDir } = await initialised();
    const result = await runCli(["plan", "set", "platinum", "--data-dir", dataDir]);
    expect(result.exitCode).toBe(2);
    expect(result.stderr).toContain("free, personal, business, self_hosted");
  });

  test("commands on a data dir that was never initialised fail without creating a store", async () => {
    const dataDir = join(tempDir(), "nothing-here");
    const result = await runCli(["plan", "show", "--data-dir", dataDir]);
    expect(result.exitCode).toBe(1);
    expect(result.stderr).toContain("licensing init");
    expect(existsSync(join(dataDir, "licensing.db"))).toBe(false);
  });
});

describe("usage errors", () => {
  test.each([
    [["frobnicate"], 'unknown command "frobnicate"'],
    [["keys"], "a subcommand is needed"],
    [["keys", "rotate"], 'unknown subcommand "rotate"'],
    [[], "Usage:"],
  ])("%p exits 2 with the list of commands on stderr", async (args, message) => {
    const result = await runCli(args);
    expect(result.exitCode).toBe(2);
    expect(result.stderr).toContain(message);
    expect(result.stderr).toContain("Usage:");
    expect(result.stdout).toBe("");
  });

  test.each([
    [["serve", "--bogus"], "unknown option --bogus", "serve"],
    [["init", "--data-dir"], "--data-dir needs a value", "init"],
    [["serve", "--port", "70000"], "port number from 1 to 65535", "serve"],
    [["keys", "create", "--scopes", "all"], "--env is required", "keys create"],
    [["version", "extra"], "unexpected argument extra", "version"],
    [["--version", "extra"], "unexpected argument extra", "version"],
  ])(
    "%p exits 2 with the error and a pointer to the command's --help on stderr",
    async (args, message, name) => {
      const result = await runCli(args);
      expect(result.exitCode).toBe(2);
      const [error, hint, rest] = result.stderr.split("\n");
      expect(error).toContain(message);
      expect(hint).toBe(`Run "licensing ${name} --help" for its options.`);
      expect(rest).toBe("");
      expect(result.stdout).toBe("");
    },
  );

  test("a bad value in an environment variable is a usage error naming the variable", async () => {
    const result = await runCli(["serve"], { env: { LICENSING_PORT: "eighty" } });
    expect(result.exitCode).toBe(2);
    expect(result.stderr).toContain("LICENSING_PORT");
  });

  test.each([
    [["--help"]],
    [["init", "--help"]],
    [["serve", "-h"]],
    [["keys", "--help"]],
    [["keys", "create", "--help"]],
    [["plan", "set", "--help"]],
    [["version", "--help"]],
  ])("%p prints help on stdout and exits 0", async (args) => {
    const result = await runCli(args);
    expect(result.exitCode).toBe(0);
    expect(result.stdout).toContain("Usage:");
  });

  test("version and --version print the version alone", async () => {
    for (const args of [["version"], ["--version"]]) {
      expect(await runCli(args)).toEqual({ exitCode: 0, stdout: `${pkg.version}\n`, stderr: "" });
    }
  });

  test("serve --help lists every flag with its environment twin", async () => {
    const { stdout } = await runCli(["serve", "--help"]);
    for (const env of [
      "LICENSING_DATA_DIR",
      "LICENSING_PORT",
      "LICENSING_HOST",
      "LICENSING_BASE_URL",
      "LICENSING_KEYSTORE_PASSPHRASE_FILE",
      "LICENSING_SMTP_URL",
      "LICENSING_MAIL_FROM",
      "LICENSING_WEBHOOK_ALLOW_PRIVATE_NETWORKS",
    ]) {
      expect(stdout).toContain(env);
    }
  });
});

describe("refusing a bad keystore at start-up", () => {
  test("a wrong passphrase exits 1 with one clear line and never listens", async () => {
    const { dataDir } = await initialised({ LICENSING_KEYSTORE_PASSPHRASE: "the right passphrase" });
    const result = await runServeToExit(["--data-dir", dataDir], {
      env: { LICENSING_KEYSTORE_PASSPHRASE: "the wrong passphrase" },
    });
    expect(result.exitCode).toBe(1);
    expect(result.stderr).toContain("the keystore passphrase is wrong");
    expect(result.stderr).not.toContain("    at ");
    expect(result.stderr).not.toContain('"msg":"listening"');
    expect(result.stdout).not.toContain("listening");
    expect(await isListening(result.port)).toBe(false);
  });

  test("a keystore with one flipped ciphertext byte is refused", async () => {
    const { dataDir } = await initialised();
    const path = join(dataDir, "keystore.json");
    const doc = JSON.parse(readFileSync(path, "utf8"));
    const ciphertext: string = doc.entries[0].ciphertext;
    doc.entries[0].ciphertext = `${ciphertext.slice(0, 10)}${ciphertext[10] === "A" ? "B" : "A"}${ciphertext.slice(11)}`;
    writeFileSync(path, JSON.stringify(doc, null, 2));
    const result = await runServeToExit(["--data-dir", dataDir]);
    expect(result.exitCode).toBe(1);
    expect(result.stderr).toContain("modified outside the service");
    expect(result.stderr).not.toContain("    at ");
    expect(await isListening(result.port)).toBe(false);
  });

  test("a missing keystore beside an existing store is refused, not re-initialised", async () => {
    const { dataDir } = await initialised();
    rmSync(join(dataDir, "keystore.json"));
    const result = await runServeToExit(["--data-dir", dataDir]);
    expect(result.exitCode).toBe(1);
    expect(result.stderr).toContain("no keystore");
    expect(result.stdout).not.toContain("lsk_");
    expect(existsSync(join(dataDir, "keystore.json"))).toBe(false);
  });

  /** A store file that is there but holds nothing: truncated to nothing, or a database with no tables. */
  const emptied = {
    "a 0-byte": (path: string) => writeFileSync(path, ""),
    "a blank": (path: string) => {
      rmSync(path);
      const sqlite = new Database(path, { create: true });
      sqlite.run("VACUUM");
      sqlite.close();
    },
  };

  test.each([
    ["a 0-byte", "is empty (0 bytes)"],
    ["a blank", "has no tables"],
  ] as const)(
    "%s store beside a keystore is refused like a missing one, and left as it is",
    async (kind, reason) => {
      const { dataDir } = await initialised();
      const store = join(dataDir, "licensing.db");
      emptied[kind](store);
      const before = readFileSync(store);
      const served = await runServeToExit(["--data-dir", dataDir]);
      expect(served.exitCode).toBe(1);
      expect(served.stderr.trim().split("\n")).toEqual([expect.stringContaining(reason)]);
      expect(served.stderr).toContain("restore the store from a backup");
      expect(await isListening(served.port)).toBe(false);
      const shown = await runCli(["plan", "show", "--data-dir", dataDir]);
      expect(shown.exitCode).toBe(1);
      expect(shown.stderr).toContain(reason);
      expect(readFileSync(store)).toEqual(before);
      expect(existsSync(`${store}-wal`)).toBe(false);
    },
  );
});
