import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * `licensing keys` on what an operator types: a key's name is printed back by `keys list`, so it
 * follows the API's name rule, and the key itself given where its id belongs is never echoed.
 */
const work = mkdtempSync(join(tmpdir(), "keys-cli-"));
const dataDir = join(work, "data");
const ENV = { LICENSING_KEYSTORE_PASSPHRASE: "a passphrase for the keys tests" };
const NAME_RULE =
  "licensing keys create: --name must be one line of 1 to 200 characters without control characters\n" +
  'Run "licensing keys create --help" for its options.\n';

const keys = (...args: string[]) => runInProcess(["keys", ...args, "--data-dir", dataDir], work, ENV);
const create = (name: string) => keys("create", "--env", "test", "--scopes", "all", "--name", name, "--json");
const listed = async (): Promise<{ id: string; name: string; revoked_at: string | null }[]> =>
  JSON.parse((await keys("list", "--json")).stdout);

beforeAll(async () => {
  expect((await runInProcess(["init", "--data-dir", dataDir, "--json"], work, ENV)).code).toBe(0);
});
afterAll(() => rmSync(work, { recursive: true, force: true }));

describe("keys create --name", () => {
  test.each([
    ["a line break and an escape sequence", "a\nb\x1b[31mRED"],
    ["a carriage return", "ci\rforged"],
    ["a tab", "ci\tkey"],
    ["DEL", "ci\x7f"],
    ["a C1 control character", "ci\u0085key"],
    ["201 characters", "n".repeat(201)],
  ])("a name with %s exits 2 with the name rule on one line and stores nothing", async (_, name) => {
    const before = (await listed()).length;
    const result = await create(name);
    expect(result.code).toBe(2);
    expect(result.stdout).toBe("");
    expect(result.stderr).toBe(NAME_RULE);
    expect((await listed()).length).toBe(before);
  });

  test("a name of 200 characters, the API's bound, is kept whole", async () => {
    const name = "n".repeat(200);
    const result = await create(name);
    expect(result.code).toBe(0);
    const { id } = JSON.parse(result.stdout);
    expect((await listed()).find((key) => key.id === id)?.name).toBe(name);
  });
});

describe("keys list", () => {
  test("a name stored with control characters before the rule is printed with them escaped", async () => {
    const { id } = JSON.parse((await create("placeholder")).stdout);
    const db = new Database(join(dataDir, "licensing.db"));
    try {
      db.run("UPDATE api_keys SET name = ? WHERE id = ?", ["a\nb\x1b[31mRED\u009b", id]);
    } finally {
      db.close();
    }
    const result = await keys("list");
    expect(result.code).toBe(0);
    const row = result.stdout.split("\n").find((line) => line.startsWith(id));
    expect(row).toEndWith("a\\u000ab\\u001b[31mRED\\u009b");
    expect(result.stdout).not.toContain("\x1b");
    expect(result.stdout).not.toContain("\u009b");
    // --json escapes them as JSON does, so it still gives the name as stored.
    expect((await listed()).find((key) => key.id === id)?.name).toBe("a\nb\x1b[31mRED\u009b");
  });
});

describe("keys revoke", () => {
  test("given the API key itself instead of its id, it exits 2 without echoing the key and revokes nothing", async () => {
    const { api_key: apiKey, id } = JSON.parse((await create("to be revoked by id")).stdout);
    for (const argument of [apiKey, ` ${apiKey}`, `Bearer ${apiKey}`]) {
      const result = await keys("revoke", argument);
      expect(result.code).toBe(2);
      expect(result.stdout).toBe("");
      expect(result.stderr).toBe(
        "licensing keys revoke: that looks like an API key, not its id: give the key_… id that licensing keys list shows\n" +
          'Run "licensing keys revoke --help" for its options.\n',
      );
      expect(result.stderr).not.toContain(apiKey.slice(4));
    }
    expect((await listed()).find((key) => key.id === id)?.revoked_at).toBeNull();
    expect((await keys("revoke", id)).code).toBe(0);
  });
});
