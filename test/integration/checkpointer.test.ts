import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  type Checkpointer,
  type CheckpointerOptions,
  startCheckpointer,
} from "../../src/store/checkpointer.ts";
import { openStore, type Store } from "../../src/store/db.ts";
import { GroupCommit } from "../../src/store/group-commit.ts";

let dir: string;
let store: Store;
let running: Checkpointer[] = [];

/** startCheckpointer, remembered so that each test's descriptor is closed after its store. */
function start(path: string, options: CheckpointerOptions = {}): Checkpointer {
  const checkpointer = startCheckpointer(store.sqlite, path, options);
  running.push(checkpointer);
  return checkpointer;
}

function freshStore(): string {
  dir = mkdtempSync(join(tmpdir(), "licensing-checkpoint-"));
  const path = join(dir, "licensing.db");
  store = openStore(path);
  store.sqlite.run("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)");
  return path;
}

afterEach(async () => {
  for (const checkpointer of running) await checkpointer.stop();
  store.close();
  for (const checkpointer of running) checkpointer.closeDatabaseFile();
  running = [];
  rmSync(dir, { recursive: true, force: true });
});

const autocheckpoint = () =>
  store.sqlite.query<{ wal_autocheckpoint: number }, []>("PRAGMA wal_autocheckpoint").get()
    ?.wal_autocheckpoint;

test("the worker copies committed pages into the database file, off the writing connection", async () => {
  const path = freshStore();
  const results: { log: number; checkpointed: number }[] = [];
  const checkpointer = start(path, {
    intervalMs: 20,
    onCheckpoint: (result) => results.push(result),
  });
  expect(await checkpointer.ready).toBe(true);
  const insert = store.sqlite.prepare("INSERT INTO t (v) VALUES (?)");
  store.sqlite.transaction(() => {
    for (let i = 0; i < 500; i++) insert.run("x".repeat(400));
  })();
  const deadline = Date.now() + 5_000;
  while (!results.some((r) => r.checkpointed > 0 && r.checkpointed === r.log) && Date.now() < deadline)
    await Bun.sleep(10);
  // Everything written so far reached the database file without this connection checkpointing.
  expect(results.some((r) => r.checkpointed > 0 && r.checkpointed === r.log)).toBe(true);
  await checkpointer.stop();
});

test("while the worker runs the server connection checkpoints only past the safety net, and again normally after stop", async () => {
  const path = freshStore();
  expect(autocheckpoint()).toBe(1000);
  const checkpointer = start(path, { intervalMs: 1000 });
  expect(await checkpointer.ready).toBe(true);
  expect(autocheckpoint()).toBe(10_000);
  await checkpointer.stop();
  expect(autocheckpoint()).toBe(1000);
});

test("data written while checkpoints run is all there after a reopen", async () => {
  const path = freshStore();
  const checkpointer = start(path, { intervalMs: 5 });
  expect(await checkpointer.ready).toBe(true);
  const insert = store.sqlite.prepare("INSERT INTO t (v) VALUES (?)");
  for (let i = 0; i < 2_000; i++) {
    insert.run(`row ${i}`);
    if (i % 100 === 0) await Bun.sleep(1);
  }
  await checkpointer.stop();
  store.close();
  store = openStore(path);
  const count = store.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM t").get()?.n;
  expect(count).toBe(2_000);
  const integrity = store.sqlite.query<{ integrity_check: string }, []>("PRAGMA integrity_check").get();
  expect(integrity?.integrity_check).toBe("ok");
});

test("under steady writes the held catch-up lets the next commit restart the WAL, so the file stays small", async () => {
  const path = freshStore();
  const commits = new GroupCommit(store.sqlite);
  const restarts: { heldMs: number; caughtUp: boolean; databaseSyncMs: number }[] = [];
  const checkpointer = start(path, {
    intervalMs: 5,
    writes: commits,
    restartAtFrames: 200,
    onRestart: (result) => restarts.push(result),
  });
  expect(await checkpointer.ready).toBe(true);
  const insert = store.sqlite.prepare("INSERT INTO t (v) VALUES (?)");
  let largestWal = 0;
  // ~4,000 commits of a page or more each, never pausing: without restarts the WAL would hold them all.
  for (let i = 0; i < 4_000; i++) {
    await commits.run(() => insert.run("x".repeat(3_000)));
    if (i % 50 === 0) largestWal = Math.max(largestWal, statSync(`${path}-wal`).size);
  }
  await checkpointer.stop();
  expect(restarts.some((r) => r.caughtUp)).toBe(true);
  // Each restart's unheld prepare step synced the database file (the time it took is reported), so
  // the held catch-up's own sync had only the last few pages to flush; the effect on the hold is
  // measured by test/bench/latency.ts, not here.
  for (const restart of restarts) expect(restart.databaseSyncMs).toBeGreaterThan(0);
  // Without restarts the WAL holds every frame until the server connection's safety net at
  // 10,000 pages (~41 MB here). With them it stays far smaller (2-8 MB on a quiet machine); the
  // bound leaves room for a CI machine busy with other test files, where the worker lags.
  expect(largestWal).toBeLessThan(9_000 * 4_120);
  const count = store.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM t").get()?.n;
  expect(count).toBe(4_000);
});

test("without writes to hold the WAL is never restarted early and nothing waits", async () => {
  const path = freshStore();
  const restarts: unknown[] = [];
  const checkpointer = start(path, {
    intervalMs: 5,
    restartAtFrames: 10,
    onRestart: (result) => restarts.push(result),
  });
  expect(await checkpointer.ready).toBe(true);
  const insert = store.sqlite.prepare("INSERT INTO t (v) VALUES (?)");
  for (let i = 0; i < 200; i++) {
    insert.run("x".repeat(3_000));
    if (i % 20 === 0) await Bun.sleep(2);
  }
  await checkpointer.stop();
  expect(restarts).toEqual([]);
});

/** This process's POSIX locks on the file at `path`, from /proc/locks (Linux). */
function locksHeldOn(path: string): number {
  const inode = statSync(path).ino;
  return readFileSync("/proc/locks", "utf8")
    .split("\n")
    .filter((line) => {
      const fields = line.trim().split(/\s+/);
      return fields[1] === "POSIX" && fields[4] === String(process.pid) && fields[5]?.endsWith(`:${inode}`);
    }).length;
}

test("the store keeps SQLite's lock on its database file until the checkpointer's own descriptor is closed, last", async () => {
  const path = freshStore();
  const checkpointer = start(path, { intervalMs: 5 });
  expect(await checkpointer.ready).toBe(true);
  store.sqlite.run("INSERT INTO t (v) VALUES ('x')");
  // An open WAL connection holds a shared lock on the database file.
  expect(locksHeldOn(path)).toBeGreaterThan(0);
  // Closing any descriptor of the file would drop every lock of the process: the checkpointer
  // keeps its descriptor through stop() and refuses to close it before then.
  expect(() => checkpointer.closeDatabaseFile()).toThrow("stop() before closeDatabaseFile()");
  await checkpointer.stop();
  expect(locksHeldOn(path)).toBeGreaterThan(0);
  store.sqlite.run("INSERT INTO t (v) VALUES ('y')");
  expect(store.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM t").get()?.n).toBe(2);
});

test("a worker that cannot open the store says so once, and the server connection keeps checkpointing itself", async () => {
  freshStore();
  const errors: string[] = [];
  // A directory: the worker's SQLite connection cannot open it.
  const checkpointer = start(dir, { intervalMs: 5, onError: (message) => errors.push(message) });
  expect(await checkpointer.ready).toBe(false);
  expect(errors).toHaveLength(1);
  expect(errors[0]).toContain("cannot open the store");
  // SQLite's own automatic checkpoints were never turned down.
  expect(autocheckpoint()).toBe(1000);
  await checkpointer.stop();
});
