import { afterAll, describe, expect, test } from "bun:test";
import { type SpawnSyncOptions, spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * A start that cannot work says so before it writes anything, in words that say what to change:
 * a data directory this user cannot write, and (on a first start, before the one-time API keys
 * are made and shown) a port that is in use. Through the real entry point, in child processes.
 */
const MAIN = join(import.meta.dir, "../../src/main.ts");
const PASSPHRASE = "the operator's passphrase";
const work = mkdtempSync(join(tmpdir(), "first-start-refusals-"));
// Other users must reach the directories below it (the unprivileged child runs as one).
chmodSync(work, 0o755);
afterAll(() => rmSync(work, { recursive: true, force: true }));

let made = 0;
const pathFor = (name: string) => join(work, `${name}-${made++}`);

/**
 * Runs as root here, and root writes where the modes say no: the child then runs as `nobody`, for
 * whom a root-owned 0755 directory is what a read-only one is to anyone. Run by another user, the
 * child runs as that user, and the directory is made read-only with chmod. Both see the same refusal.
 */
const root = process.getuid?.() === 0;
const CHILD_UID = root ? 65534 : (process.getuid?.() ?? 0);
const unprivileged: Pick<SpawnSyncOptions, "uid" | "gid"> = root ? { uid: 65534, gid: 65534 } : {};
const READ_ONLY_DIR_MODE = root ? 0o755 : 0o555;

function cli(args: string[], env: Record<string, string> = {}, as: "unprivileged" | "self" = "unprivileged") {
  const run = spawnSync(process.execPath, [MAIN, ...args], {
    cwd: work,
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: work, ...env },
    encoding: "utf8",
    ...(as === "unprivileged" ? unprivileged : {}),
  });
  return { code: run.status, stdout: run.stdout, stderr: run.stderr };
}

/** A data directory the unprivileged child may read but not write; `init` first when asked. */
function readOnlyDataDir(initialised: boolean): string {
  const dir = pathFor(initialised ? "read-only-initialised" : "read-only-empty");
  if (initialised) {
    const init = cli(["init", "--data-dir", dir], { LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE }, "self");
    expect(init.code).toBe(0);
    for (const name of readdirSync(dir)) chmodSync(join(dir, name), 0o644);
  } else {
    mkdirSync(dir);
  }
  chmodSync(dir, READ_ONLY_DIR_MODE);
  return dir;
}

const notWritable = (dir: string) =>
  `the data directory ${dir} is not writable by this user (uid ${CHILD_UID}); it belongs to uid ` +
  `${process.getuid?.()}, mode 0${READ_ONLY_DIR_MODE.toString(8)}: give it to the user that runs the ` +
  "service (chown), or run the service as its owner\n";

describe("a data directory this user cannot write", () => {
  test("serve on an empty one says so, instead of a bare EACCES on keystore.passphrase, and writes nothing", () => {
    const dir = readOnlyDataDir(false);
    const run = cli(["serve", "--data-dir", dir, "--port", "18999"]);
    expect(run).toEqual({ code: 1, stdout: "", stderr: `licensing serve: ${notWritable(dir)}` });
    expect(readdirSync(dir)).toEqual([]);
  });

  test("init on one says so too", () => {
    const dir = readOnlyDataDir(false);
    const run = cli(["init", "--data-dir", dir], { LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE });
    expect(run).toEqual({ code: 1, stdout: "", stderr: `licensing init: ${notWritable(dir)}` });
    expect(readdirSync(dir)).toEqual([]);
  });

  test("serve on an initialised one says so, instead of blaming a serve.lock that does not exist", () => {
    const dir = readOnlyDataDir(true);
    const before = readdirSync(dir).sort();
    const run = cli(["serve", "--data-dir", dir, "--port", "18999"], {
      LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE,
    });
    expect(run.code).toBe(1);
    expect(run.stderr).toBe(`licensing serve: ${notWritable(dir)}`);
    expect(run.stderr).not.toContain("serve.lock");
    expect(readdirSync(dir).sort()).toEqual(before);
  });

  test("a store file this user cannot write, in a directory it can, is named", () => {
    const dir = readOnlyDataDir(true);
    // Writable by everyone: only the store file (0644, or 0444 for its owner) is refused now.
    chmodSync(dir, 0o777);
    if (!root) chmodSync(join(dir, "licensing.db"), 0o444);
    const run = cli(["serve", "--data-dir", dir, "--port", "18999"], {
      LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE,
    });
    expect(run.code).toBe(1);
    expect(run.stderr).toStartWith(
      `licensing serve: the file ${join(dir, "licensing.db")} is not writable by this user (uid ${CHILD_UID})`,
    );
  });

  test("a data directory that cannot be created names the directory and the reason", () => {
    const parent = readOnlyDataDir(false);
    const dir = join(parent, "data");
    const run = cli(["init", "--data-dir", dir], { LICENSING_KEYSTORE_PASSPHRASE: PASSPHRASE });
    expect(run.code).toBe(1);
    expect(run.stderr).toStartWith(`licensing init: cannot create the data directory ${dir}: `);
    expect(run.stderr).toContain("EACCES");
  });
});

describe("a port in use", () => {
  const withBusyPort = async (work: (port: number) => void) => {
    const holder = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(null) });
    try {
      work(holder.port ?? 0);
    } finally {
      await holder.stop(true);
    }
  };

  test("a first start refuses before it makes the one-time API keys, and says which flag and variable choose another", async () => {
    const dir = pathFor("busy-port-fresh");
    await withBusyPort((port) => {
      const run = cli(["serve", "--data-dir", dir, "--port", String(port)], {}, "self");
      expect(run.code).toBe(1);
      expect(run.stdout).toBe("");
      expect(run.stderr).toContain(`cannot listen on 127.0.0.1:${port}`);
      expect(run.stderr).toContain("choose another port with --port (LICENSING_PORT)");
    });
    // Nothing was set up, so the next start that can listen makes and shows the keys.
    expect(existsSync(join(dir, "licensing.db"))).toBe(false);
    expect(existsSync(join(dir, "keystore.json"))).toBe(false);
  });

  test("an initialised directory gets the same hint", async () => {
    const dir = pathFor("busy-port-initialised");
    expect(cli(["init", "--data-dir", dir], {}, "self").code).toBe(0);
    await withBusyPort((port) => {
      const run = cli(["serve", "--data-dir", dir, "--port", String(port)], {}, "self");
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(`cannot listen on 127.0.0.1:${port}`);
      expect(run.stderr).toContain("choose another port with --port (LICENSING_PORT)");
    });
  });
});
