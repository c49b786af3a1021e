import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * A command whose stdout cannot take what it prints (a full disk, here /dev/full) fails with one
 * line and exit 1: an exit 0 would tell a script all went well, and a secret printed only once
 * (an API key) would be lost without a word. What such a command created is named, so it can be
 * revoked. The commands run as the executable does, in child processes with stdout on /dev/full.
 */
const work = mkdtempSync(join(tmpdir(), "stdout-full-"));
const MAIN = join(import.meta.dir, "../../src/main.ts");
const ENV = { PATH: Bun.env.PATH, LICENSING_KEYSTORE_PASSPHRASE: "a passphrase for the stdout tests" };
/** Bun's start-up, and a first start's key derivation, in a child process. */
const PROCESS_TIMEOUT_MS = 20_000;
const NO_SPACE = "no space left on device";

/** Runs the command line with stdout on /dev/full: its exit code and what it said on stderr. */
function runToFullDisk(args: string[]): { code: number | null; stderr: string } {
  const full = openSync("/dev/full", "w");
  try {
    const run = Bun.spawnSync([process.execPath, MAIN, ...args], {
      cwd: work,
      stdout: full,
      stderr: "pipe",
      env: ENV,
      // A serve that went on despite the failure would never end on its own.
      timeout: 15_000,
    });
    return { code: run.exitCode, stderr: run.stderr.toString() };
  } finally {
    closeSync(full);
  }
}

/** The API keys a data dir holds, as `keys list --json` reports them. */
async function keysIn(dataDir: string): Promise<{ id: string; name: string; revoked_at: string | null }[]> {
  const listed = await runInProcess(["keys", "list", "--json", "--data-dir", dataDir], work);
  expect(listed.code).toBe(0);
  return JSON.parse(listed.stdout);
}

/** A port nothing listens on now (serve checks it before its first start, then stops). */
async function freePort(): Promise<number> {
  const probe = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(null) });
  const port = probe.port;
  await probe.stop(true);
  if (port === undefined) throw new Error("no free port");
  return port;
}

const dataDir = join(work, "data");
beforeAll(async () => {
  expect((await runInProcess(["init", "--json", "--data-dir", dataDir], work, ENV)).code).toBe(0);
});
afterAll(() => rmSync(work, { recursive: true, force: true }));

describe("stdout that cannot be written", () => {
  test(
    "keys create fails with exit 1 and names the key nobody saw, which is live until revoked",
    async () => {
      const before = new Set((await keysIn(dataDir)).map((key) => key.id));
      for (const format of [["--json"], []]) {
        const run = runToFullDisk([
          "keys",
          "create",
          "--env",
          "live",
          "--scopes",
          "all",
          "--name",
          "unseen",
          ...format,
          "--data-dir",
          dataDir,
        ]);
        const created = (await keysIn(dataDir)).filter((key) => !before.has(key.id));
        expect(created).toHaveLength(1);
        const [key] = created;
        before.add(key?.id ?? "");
        expect(run).toEqual({
          code: 1,
          stderr:
            `licensing keys create: created API key ${key?.id} but could not print it (${NO_SPACE}); nobody has ` +
            `seen the key: revoke it with "licensing keys revoke ${key?.id}" and create another\n`,
        });
      }
    },
    PROCESS_TIMEOUT_MS,
  );

  test.each([
    ["init", ["init"]],
    ["init --json", ["init", "--json"]],
    ["a first start of serve", ["serve", "--host", "127.0.0.1"]],
  ])(
    "%s fails with exit 1 and names the data dir and the two keys to revoke; the data dir is set up",
    async (_, args) => {
      const dir = mkdtempSync(join(work, "first-"));
      // serve checks its address before a first start; it stops before it would listen there.
      const port = args[0] === "serve" ? ["--port", String(await freePort())] : [];
      const run = runToFullDisk([...args, ...port, "--data-dir", dir]);
      const keys = await keysIn(dir);
      const byName = (name: string) => keys.find((key) => key.name === name)?.id;
      const [live, test] = [byName("live key (created by init)"), byName("test key (created by init)")];
      expect(run).toEqual({
        code: 1,
        stderr:
          `licensing ${args[0]}: initialised ${dir}, but its API keys could not be printed (${NO_SPACE}); ` +
          `nobody has seen them: create new ones with "licensing keys create --data-dir ${dir}", then revoke ` +
          `${live} and ${test} with "licensing keys revoke"\n`,
      });
      expect(keys.every((key) => key.revoked_at === null)).toBe(true);
      // The first start finished: no staging folder left for the next start to clear.
      expect(readdirSync(dir).filter((name) => name.startsWith(".init-"))).toEqual([]);
    },
    PROCESS_TIMEOUT_MS,
  );

  test(
    "a command that prints a listing or its help fails with exit 1 and one line",
    () => {
      expect(runToFullDisk(["keys", "list", "--data-dir", dataDir])).toEqual({
        code: 1,
        stderr: `licensing keys list: cannot print to stdout: ${NO_SPACE}\n`,
      });
      expect(runToFullDisk(["keys", "list", "--help"])).toEqual({
        code: 1,
        stderr: `licensing keys list: cannot print to stdout: ${NO_SPACE}\n`,
      });
      expect(runToFullDisk(["--help"])).toEqual({
        code: 1,
        stderr: `licensing: cannot print to stdout: ${NO_SPACE}\n`,
      });
    },
    PROCESS_TIMEOUT_MS,
  );
});
