import { afterAll, describe, expect, test } from "bun:test";
import {
  appendFileSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  watch,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CliError } from "../../src/cli/console.ts";
import { finishInit, type InitStep, initialise } from "../../src/cli/init.ts";
import { INIT_STAGING_PREFIX, STAGED } from "../../src/cli/interrupted-init.ts";
import { type Env, resolveConfig } from "../../src/config.ts";
import { openKeystore } from "../../src/server.ts";
import { takeServeLock } from "../../src/store/serve-lock.ts";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * A first start (`init`, or `serve` on an empty directory) that is stopped half-way: SIGINT,
 * SIGTERM, SIGHUP and SIGQUIT wait until the new API keys are printed, and what kill -9 or a crash leaves at any step
 * is cleared by the next start, which then sets the directory up afresh and shows its keys. The
 * steps are stopped deterministically: `initialise` reports each one, and the test copies the data
 * directory as it is at that moment, which is exactly what a process killed there would leave.
 */
const work = mkdtempSync(join(tmpdir(), "interrupted-first-start-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const MAIN = join(import.meta.dir, "../../src/main.ts");
const PASSPHRASE = "a passphrase of the operator's own";

let made = 0;
const freshDir = (name: string) => join(work, `${name}-${made++}`);

/** A first start run to the end, and the data directory as it was right after `step`. */
function stoppedAfter(step: InitStep, env: Env = {}): { dir: string; keys: { live: string; test: string } } {
  const full = freshDir("full");
  const dir = freshDir(`stopped-after-${step.replace(" ", "-")}`);
  const result = initialise(resolveConfig({ "data-dir": full }, env, work), (reached) => {
    if (reached === step) cpSync(full, dir, { recursive: true });
  });
  finishInit(result);
  expect(existsSync(dir)).toBe(true);
  return { dir, keys: result.apiKeys };
}

const leftovers = (dir: string) => readdirSync(dir).filter((name) => name.startsWith(INIT_STAGING_PREFIX));
const printedKeys = (stdout: string) => [...stdout.matchAll(/lsk_(?:live|test)_\w+/g)].map((m) => m[0]);

/** The keys the store holds, as `licensing keys list` shows them (their first characters). */
async function listedHints(dir: string): Promise<string[]> {
  const listed = await runInProcess(["keys", "list", "--data-dir", dir, "--json"], work);
  expect(listed.code).toBe(0);
  return (JSON.parse(listed.stdout) as { hint: string }[]).map((key) => key.hint).sort();
}
const hintsOf = (keys: string[]) => keys.map((key) => `${key.slice(0, 13)}…`).sort();

/** A port nothing listens on now (the server under test binds it again a moment later). */
async function freePort(): Promise<number> {
  const probe = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(null) });
  const port = probe.port;
  await probe.stop(true);
  if (port === undefined) throw new Error("no free port");
  return port;
}

const passphraseIn = (dir: string) => readFileSync(join(dir, "keystore.passphrase"), "utf8").trim();

describe("a first start stopped before it placed the keystore is cleared and done again", () => {
  test.each<InitStep>(["staged", "passphrase placed", "store placed"])(
    "stopped after %p: the next init removes the leftovers, prints new keys and announces the new passphrase file",
    async (step) => {
      const { dir, keys: lost } = stoppedAfter(step);
      const run = await runInProcess(["init", "--data-dir", dir], work);
      expect(run.code).toBe(0);
      expect(run.stderr).toContain(`an earlier first start of ${dir} was stopped before it finished`);
      const keys = printedKeys(run.stdout);
      expect(keys).toHaveLength(2);
      expect(keys).not.toContain(lost.live);
      expect(run.stdout).toContain(
        `A random keystore passphrase was written to ${join(dir, "keystore.passphrase")}`,
      );
      expect(leftovers(dir)).toEqual([]);
      // The store holds the two keys just shown and no others, and the keystore opens.
      expect(await listedHints(dir)).toEqual(hintsOf(keys));
      expect(() => openKeystore(dir, passphraseIn(dir))).not.toThrow();
    },
  );

  test("`serve` on the directory a start left with a store and no keystore sets it up and serves (was a dead end)", async () => {
    const { dir } = stoppedAfter("store placed");
    expect(existsSync(join(dir, "licensing.db"))).toBe(true);
    expect(existsSync(join(dir, "keystore.json"))).toBe(false);
    const child = Bun.spawn(
      [process.execPath, MAIN, "serve", "--data-dir", dir, "--port", String(await freePort())],
      {
        stdout: "pipe",
        stderr: "pipe",
        env: { PATH: Bun.env.PATH },
      },
    );
    let stdout = "";
    const decoder = new TextDecoder();
    for await (const chunk of child.stdout) {
      stdout += decoder.decode(chunk, { stream: true });
      if (stdout.includes("listening on")) break;
    }
    child.kill("SIGTERM");
    const [code, stderr] = await Promise.all([child.exited, new Response(child.stderr).text()]);
    expect(stdout).toContain("listening on");
    expect(printedKeys(stdout)).toHaveLength(2);
    expect(stderr).toContain("was stopped before it finished");
    expect(code).toBe(0);
    expect(leftovers(dir)).toEqual([]);
  });

  test("with the passphrase in LICENSING_KEYSTORE_PASSPHRASE, no passphrase file appears, and the new keystore opens with it", async () => {
    const env = { LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE };
    const { dir } = stoppedAfter("store placed", env);
    const run = await runInProcess(["init", "--data-dir", dir], work, env);
    expect(run.code).toBe(0);
    expect(existsSync(join(dir, "keystore.passphrase"))).toBe(false);
    expect(() => openKeystore(dir, PASSPHRASE)).not.toThrow();
  });

  test("a passphrase file the operator put in the directory before the first start stays, and is used", async () => {
    const full = freshDir("own-passphrase");
    mkdirSync(full, { mode: 0o700 });
    writeFileSync(join(full, "keystore.passphrase"), `${PASSPHRASE}\n`, { mode: 0o600 });
    const dir = freshDir("own-passphrase-stopped");
    finishInit(
      initialise(resolveConfig({ "data-dir": full }, {}, work), (step) => {
        if (step === "store placed") cpSync(full, dir, { recursive: true });
      }),
    );
    const run = await runInProcess(["init", "--data-dir", dir], work);
    expect(run.code).toBe(0);
    expect(run.stdout).not.toContain("A random keystore passphrase");
    expect(passphraseIn(dir)).toBe(PASSPHRASE);
    expect(() => openKeystore(dir, PASSPHRASE)).not.toThrow();
  });

  test("a store copied into place only in part (as earlier versions could leave it) counts as the start's, and is cleared", async () => {
    const { dir } = stoppedAfter("staged");
    const [folder] = leftovers(dir);
    const staged = readFileSync(join(dir, folder!, STAGED.store));
    writeFileSync(join(dir, "licensing.db"), staged.subarray(0, 4096 * 3), { mode: 0o600 });
    const run = await runInProcess(["init", "--data-dir", dir], work);
    expect(run.code).toBe(0);
    expect(printedKeys(run.stdout)).toHaveLength(2);
    expect(leftovers(dir)).toEqual([]);
  });
});

describe("what is not a first start's to remove stays", () => {
  test("a store written to since the start stopped is refused with what to do, and nothing is removed", async () => {
    const { dir } = stoppedAfter("store placed");
    appendFileSync(join(dir, "licensing.db"), "written since");
    const before = readdirSync(dir).sort();
    const run = await runInProcess(["init", "--data-dir", dir], work);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain(
      "a store without a keystore that is not the one it made, or was written to since",
    );
    expect(run.stderr).toContain("nothing was removed");
    expect(run.stderr).toContain("delete it and the folder and start again");
    expect(readdirSync(dir).sort()).toEqual(before);
    expect(readFileSync(join(dir, "licensing.db"), "utf8").endsWith("written since")).toBe(true);
  });

  test("a link or a file named like a staging folder is never followed or removed", async () => {
    const outside = freshDir("outside");
    mkdirSync(outside);
    writeFileSync(join(outside, "precious"), "keep me");
    const dir = freshDir("links");
    mkdirSync(dir, { mode: 0o700 });
    symlinkSync(outside, join(dir, `${INIT_STAGING_PREFIX}link`));
    writeFileSync(join(dir, `${INIT_STAGING_PREFIX}file`), "not a folder");
    const run = await runInProcess(["init", "--data-dir", dir], work);
    expect(run.code).toBe(0);
    expect(run.stderr).toBe("");
    expect(readFileSync(join(outside, "precious"), "utf8")).toBe("keep me");
    expect(existsSync(join(dir, `${INIT_STAGING_PREFIX}link`))).toBe(true);
    expect(existsSync(join(dir, `${INIT_STAGING_PREFIX}file`))).toBe(true);
  });

  test("a start stopped after placing the keystore is whole: init refuses it, warns that its keys may not have been shown, and removes the folder", async () => {
    const { dir, keys } = stoppedAfter("keystore placed");
    expect(leftovers(dir)).toHaveLength(1);
    const run = await runInProcess(["init", "--data-dir", dir], work);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain("maybe before it printed the new API keys");
    expect(run.stderr).toContain('create one with "licensing keys create"');
    expect(run.stderr).toContain("is already initialised");
    expect(leftovers(dir)).toEqual([]);
    // The install is the one that was set up: its keys and passphrase, nothing new.
    expect(await listedHints(dir)).toEqual(hintsOf([keys.live, keys.test]));
    expect(() => openKeystore(dir, passphraseIn(dir))).not.toThrow();
  });

  test("a first start under way in another process (it holds the lock) is neither cleared nor joined", async () => {
    const { dir } = stoppedAfter("store placed");
    const lock = takeServeLock(join(dir, "serve.lock"));
    try {
      const before = readdirSync(dir).sort();
      expect(() => initialise(resolveConfig({ "data-dir": dir }, {}, work))).toThrow(CliError);
      expect(() => initialise(resolveConfig({ "data-dir": dir }, {}, work))).toThrow(
        /another licensing process is using .*: a server, or a first start still setting the directory up/,
      );
      expect(readdirSync(dir).sort()).toEqual(before);
    } finally {
      lock?.release();
    }
  });
});

describe("Ctrl-C, SIGTERM, SIGHUP or SIGQUIT during a first start", () => {
  /**
   * The signal is sent when the `.init-*` folder appears (fs.watch, no timing guess): the keys are
   * made and placed after that, so the signal arrives in the middle of the first start.
   */
  type EndingSignal = "SIGINT" | "SIGTERM" | "SIGHUP" | "SIGQUIT";
  const interruptedServe = async (signal: EndingSignal) => {
    const dir = freshDir(`signal-${signal}`);
    mkdirSync(dir, { mode: 0o700 });
    const child = Bun.spawn(
      [process.execPath, MAIN, "serve", "--data-dir", dir, "--port", String(await freePort())],
      {
        stdout: "pipe",
        stderr: "pipe",
        env: { PATH: Bun.env.PATH },
      },
    );
    const watcher = watch(dir, (_event, name) => {
      if (name?.startsWith(INIT_STAGING_PREFIX)) {
        watcher.close();
        child.kill(signal);
      }
    });
    const [stdout, stderr, code] = await Promise.all([
      new Response(child.stdout).text(),
      new Response(child.stderr).text(),
      child.exited,
    ]);
    watcher.close();
    return { dir, stdout, stderr, code, signalCode: child.signalCode };
  };

  test.each(["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"] as const)(
    "%p waits until the keys are printed, then ends the process with the shell's status, without serving",
    async (signal) => {
      const run = await interruptedServe(signal);
      expect({ code: run.code, signalCode: run.signalCode }).toEqual({
        code: { SIGINT: 130, SIGTERM: 143, SIGHUP: 129, SIGQUIT: 131 }[signal],
        signalCode: null,
      });
      expect(printedKeys(run.stdout)).toHaveLength(2);
      expect(run.stdout).toContain("A random keystore passphrase was written to");
      expect(run.stdout).not.toContain("listening on");
      expect(run.stderr).toContain(
        `stopped by ${signal} before serving; the API keys above are not shown again`,
      );
      expect(readdirSync(run.dir).sort()).toEqual([
        "keystore.json",
        "keystore.passphrase",
        "licensing.db",
        "serve.lock",
      ]);
      expect(await listedHints(run.dir)).toEqual(hintsOf(printedKeys(run.stdout)));
    },
  );
});
