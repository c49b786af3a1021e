import { expect, test } from "bun:test";
import { tmpdir } from "node:os";
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
