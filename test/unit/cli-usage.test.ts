import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runInProcess } from "../support/in-process-cli.ts";

/** How the command line answers a mistake in how it was invoked: exit 2, on stderr, briefly. */

test("a bad option value prints the one-line error and a pointer to --help, not the whole help", async () => {
  const result = await runInProcess(["serve", "--port", "99999"], tmpdir());
  expect(result.code).toBe(2);
  expect(result.stdout).toBe("");
  expect(result.stderr).toBe(
    'licensing serve: --port must be a port number from 1 to 65535, not "99999"\n' +
      'Run "licensing serve --help" for its options.\n',
  );
});

test("a subcommand's usage error points at that subcommand's help", async () => {
  const result = await runInProcess(["keys", "create", "--bogus"], tmpdir());
  expect(result.code).toBe(2);
  expect(result.stderr).toBe(
    'licensing keys create: unknown option --bogus\nRun "licensing keys create --help" for its options.\n',
  );
});

test("serve on a wildcard host without a base URL exits 2 before touching the data dir", async () => {
  const dir = tmpdir();
  const result = await runInProcess(["serve", "--host", "0.0.0.0", "--data-dir", `${dir}/never-made`], dir);
  expect(result.code).toBe(2);
  expect(result.stderr).toStartWith("licensing serve: --host 0.0.0.0 listens on every interface");
  expect(result.stderr).toContain("--base-url (or LICENSING_BASE_URL)");
  expect(result.stdout).toBe("");
});

test("a base URL with a password in the environment is refused by any command without echoing the password", async () => {
  const dir = tmpdir();
  const result = await runInProcess(["keys", "list", "--data-dir", `${dir}/never-made`], dir, {
    LICENSING_BASE_URL: "https://admin:hunter2@x:99999",
  });
  expect(result.code).toBe(2);
  expect(result.stderr).toBe(
    'licensing keys list: LICENSING_BASE_URL must be an absolute http(s) URL, not "https://***@x:99999"\n' +
      'Run "licensing keys list --help" for its options.\n',
  );
});

describe("a wildcard host without a base URL, in the other commands that put the base URL somewhere", () => {
  // They listen on nothing, so --host is not one of their options: the wildcard reaches them
  // through LICENSING_HOST, from an environment they share with the server.
  const COMMANDS: [string, string[]][] = [
    ["offline issue", ["--license", "lic_x", "--request", "request.json", "--out", "package.zip"]],
    [
      "billing configure",
      ["--provider", "stripe", "--api-key-file", "api-key", "--webhook-secret-file", "webhook-secret"],
    ],
    ["billing offering", ["list"]],
    ["billing disable", []],
    ["billing status", []],
  ];
  const run = (name: string, args: string[], env: Record<string, string>) => {
    const dir = mkdtempSync(join(tmpdir(), "wildcard-host-"));
    const dataDir = join(dir, "never-made");
    return runInProcess([...name.split(" "), ...args, "--data-dir", dataDir], dir, env)
      .then((result) => ({ ...result, dataDirMade: existsSync(dataDir) }))
      .finally(() => rmSync(dir, { recursive: true, force: true }));
  };

  test("offline issue and every billing command exit 2 on LICENSING_HOST 0.0.0.0, :: or ::ffff:0.0.0.0 before touching the data dir", async () => {
    for (const [name, args] of COMMANDS) {
      for (const host of ["0.0.0.0", "::", "::ffff:0.0.0.0", "0:0:0:0:0:0:0:0"]) {
        const result = await run(name, args, { LICENSING_HOST: host });
        expect({ name, host, ...result }).toEqual({
          name,
          host,
          code: 2,
          stdout: "",
          stderr:
            `licensing ${name}: LICENSING_HOST ${host} listens on every interface, so it cannot be the base URL clients use: ` +
            "set --base-url (or LICENSING_BASE_URL) to the service's public URL, e.g. https://licensing.example.com\n" +
            `Run "licensing ${name} --help" for its options.\n`,
          dataDirMade: false,
        });
      }
    }
  });

  test("with a base URL, by flag or by variable, the same commands get past the rule to their own work", async () => {
    for (const [name, args] of COMMANDS) {
      for (const [extra, env] of [
        [["--base-url", "https://licensing.example.com"], { LICENSING_HOST: "0.0.0.0" }],
        [[], { LICENSING_HOST: "::", LICENSING_BASE_URL: "https://licensing.example.com" }],
      ] as const) {
        const result = await run(name, [...args, ...extra], env);
        // They fail further on (no request file, no secrets, no passphrase in an empty dir): exit 1.
        expect({ name, code: result.code }).toEqual({ name, code: 1 });
        expect(result.stderr).not.toContain("listens on every interface");
        expect(result.dataDirMade).toBe(false);
      }
    }
  });
});

test("serve --help names LICENSING_KEYSTORE_PASSPHRASE itself, and the metrics token's bounds as the check has them", async () => {
  const { code, stdout } = await runInProcess(["serve", "--help"], tmpdir());
  expect(code).toBe(0);
  expect(stdout).toMatch(/LICENSING_KEYSTORE_PASSPHRASE(?!_FILE)/);
  expect(stdout).toContain("this token (16 to 256 visible ASCII characters)");
  expect(stdout).not.toContain("16+");
});
