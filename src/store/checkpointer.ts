import type { Database } from "bun:sqlite";
import { closeSync, openSync } from "node:fs";

/**
 * WAL checkpoints off the request path. By default SQLite checkpoints inside whichever commit
 * pushes the WAL past 1,000 pages: that commit copies pages into the database file and fsyncs it
 * while requests queue behind it (the p99 stalls measured in docs/performance.md). Here the
 * server's own connection checkpoints only as a safety net (a WAL of ~40 MiB); a worker thread with its
 * own connection runs PASSIVE checkpoints, which never wait for or block the writer, on the other
 * core. Durability is unchanged: a commit is in the WAL before it is acknowledged, checkpointed or
 * not.
 *
 * The WAL file is only reused from its start ("restarted") by a write that finds every frame
 * already checkpointed, which under steady writes never happens: each checkpoint ends behind the
 * commits made while it ran. So once the WAL passes `restartAtFrames`, the device calls' group
 * commit is held for a moment (calls queue; the event loop runs on), the worker checkpoints the
 * few frames left, and the hold is released: the next commit restarts the WAL. Without this the
 * safety net fired every ~2 s at 1,200 heartbeats/s, a 10-40 ms stall on the request thread.
 *
 * The worker's source is inlined (a Blob URL) so the compiled executable needs no extra file.
 */
const WORKER_SOURCE = `
import { Database } from "bun:sqlite";
import { fdatasyncSync } from "node:fs";
let db;
// Opened and closed by the main thread (closeDatabaseFile says why); null: no unheld sync.
let databaseFd = null;
let timer;
const messageOf = (error) => String((error && error.message) || error);
function checkpoint(type) {
  try {
    const started = performance.now();
    const [row] = db.query("PRAGMA wal_checkpoint(PASSIVE)").all();
    return { type, log: row.log, checkpointed: row.checkpointed, ms: performance.now() - started };
  } catch (error) {
    // SQLITE_BUSY and friends: the next tick tries again.
    postMessage({ type: "error", message: messageOf(error) });
    // A restart step waits for its answer: it is told the step failed rather than left waiting.
    return { type, failed: true };
  }
}
// Only shortens the held catch-up, which syncs whatever is left itself: a failure is reported, and
// the restart goes on without it.
function syncDatabase(result) {
  if (result.failed || databaseFd === null) return result;
  try {
    const started = performance.now();
    fdatasyncSync(databaseFd);
    result.syncMs = performance.now() - started;
  } catch (error) {
    postMessage({ type: "error", message: "database sync: " + messageOf(error) });
  }
  return result;
}
self.onmessage = (event) => {
  const message = event.data;
  if (message.type === "prepare") {
    postMessage(syncDatabase(checkpoint("prepared")));
  } else if (message.type === "catch-up") {
    postMessage(checkpoint("caught-up"));
  } else if (message.type === "start") {
    try {
      db = new Database(message.path);
      db.run("PRAGMA busy_timeout = 1000");
    } catch (error) {
      postMessage({ type: "unavailable", message: messageOf(error) });
      return;
    }
    databaseFd = message.databaseFd;
    timer = setInterval(() => {
      const result = checkpoint("checkpointed");
      if (!result.failed) postMessage(result);
    }, message.intervalMs);
    postMessage({ type: "started" });
  } else if (message.type === "stop") {
    clearInterval(timer);
    try { db && db.close(); } catch {}
    postMessage({ type: "stopped" });
  }
};
`;

/** Writes that can pause for a moment while the WAL is restarted (store/group-commit.ts). */
export interface WriteHold {
  hold(): void;
  release(): void;
}

export interface CheckpointerOptions {
  /** How often the worker checkpoints. A heartbeat writes a few pages; 100 ms keeps the WAL small. */
  intervalMs?: number;
  /** Called with each checkpoint's result, for tests and metrics. */
  onCheckpoint?: (result: { log: number; checkpointed: number }) => void;
  /** Held while the worker catches up, so the next commit restarts the WAL; none: never held. */
  writes?: WriteHold;
  /**
   * WAL size (pages) from which a restart is arranged: 8,000 pages (~32 MiB), before the server
   * connection's own safety net (10,000). Each restart holds writes for a short catch-up checkpoint (two
   * fsyncs of little data, 2-3 ms here at the median, up to ~8), so fewer restarts mean fewer held
   * calls; the file stays under 40 MiB.
   */
  restartAtFrames?: number;
  /**
   * Called after each restart attempt: how long writes were held, how long the worker's catch-up
   * checkpoint took, whether it caught up, and how long the unheld database sync before it took.
   */
  onRestart?: (result: {
    heldMs: number;
    checkpointMs: number;
    caughtUp: boolean;
    databaseSyncMs: number;
  }) => void;
  /**
   * Called with what went wrong in the worker (a failed checkpoint or database sync); the same
   * message at most once a minute, so a failing disk is heard without a line every 100 ms.
   */
  onError?: (message: string) => void;
}

/** The longest writes are ever held, whatever the worker does (it may have died). */
const MAX_HOLD_MS = 50;

export interface Checkpointer {
  /** True once the worker runs and the server connection has stopped checkpointing itself. */
  ready: Promise<boolean>;
  /** From now on, hold these writes to restart the WAL (they exist only after start-up). */
  restartWith(writes: WriteHold): void;
  stop(): Promise<void>;
  /**
   * Closes the descriptor of the database file that the unheld syncs use: after `stop()` and only
   * once every connection to the store in this process has closed. Closing any descriptor of a
   * file drops every POSIX lock this process holds on it, SQLite's included
   * (https://sqlite.org/howtocorrupt.html, 2.2), so it stays open while SQLite may need them.
   */
  closeDatabaseFile(): void;
}

/**
 * Starts background checkpoints for the store at `path`, whose server connection is `sqlite`.
 * Until the worker has started, and if it cannot start, SQLite's automatic checkpoints stay on.
 */
export function startCheckpointer(
  sqlite: Database,
  path: string,
  options: CheckpointerOptions = {},
): Checkpointer {
  const url = URL.createObjectURL(new Blob([WORKER_SOURCE], { type: "application/javascript" }));
  const worker = new Worker(url);
  let active = true;
  /** False once the worker said it cannot run: stop() then has nobody to wait for. */
  let workerRunning = true;
  let stopped: (() => void) | undefined;
  let writes = options.writes;
  let databaseFd: number | null = null;
  try {
    databaseFd = openSync(path, "r");
  } catch {
    // Without it the held catch-up syncs the database file itself, as SQLite always does.
  }
  const reported = new Map<string, number>();
  const reportError = (message: string) => {
    const now = Date.now();
    if (now - (reported.get(message) ?? -Infinity) < 60_000) return;
    // A handful of SQLite and system messages in practice; bounded whatever the worker sends.
    if (reported.size >= 100) reported.clear();
    reported.set(message, now);
    options.onError?.(message);
  };
  const restartAtFrames = options.restartAtFrames ?? 8_000;
  // One restart at a time, in two steps. "prepare": the worker checkpoints once more without any
  // hold and syncs the database file, so little is left that is not yet in the database file or
  // not yet synced; "catch-up": writes are held while it checkpoints that little (its fsyncs are
  // short because little is dirty), and released on its answer. The database sync is the prepare
  // step's main work: SQLite syncs the database file only in a checkpoint that backfills the whole
  // WAL, which the periodic ones under load never do, so every page copied since the last restart
  // (~1 s of writes) was still dirty and the held catch-up flushed it all: 7-17 ms instead of 2-3.
  const restart = {
    step: "idle" as "idle" | "preparing" | "held",
    heldSince: 0,
    databaseSyncMs: 0,
    timeout: undefined as ReturnType<typeof setTimeout> | undefined,
    begin() {
      if (!writes || this.step !== "idle") return;
      this.step = "preparing";
      worker.postMessage({ type: "prepare" });
    },
    prepared(failed: boolean, databaseSyncMs: number) {
      if (!writes || this.step !== "preparing") return;
      this.databaseSyncMs = databaseSyncMs;
      if (!active || failed) {
        this.step = "idle";
        return;
      }
      this.step = "held";
      writes.hold();
      this.heldSince = performance.now();
      this.timeout = setTimeout(() => this.end(false, 0), MAX_HOLD_MS);
      worker.postMessage({ type: "catch-up" });
    },
    end(caughtUp: boolean, checkpointMs: number) {
      if (this.step === "preparing") this.step = "idle";
      if (!writes || this.step !== "held") return;
      this.step = "idle";
      clearTimeout(this.timeout);
      const heldMs = performance.now() - this.heldSince;
      writes.release();
      options.onRestart?.({ heldMs, checkpointMs, caughtUp, databaseSyncMs: this.databaseSyncMs });
    },
  };
  const ready = new Promise<boolean>((resolve) => {
    worker.onmessage = (event: MessageEvent) => {
      const message = event.data as {
        type: string;
        log?: number;
        checkpointed?: number;
        ms?: number;
        syncMs?: number;
        failed?: boolean;
        message?: string;
      };
      if (message.type === "started") {
        URL.revokeObjectURL(url);
        if (!active) return resolve(false);
        // Only now, and not to zero: under writes with no pause the worker's checkpoints never
        // catch up completely, the WAL is never restarted and would grow without bound; past
        // 10,000 pages (~40 MiB, ten times SQLite's default) the server connection checkpoints
        // itself again, as before.
        sqlite.run("PRAGMA wal_autocheckpoint = 10000");
        // A WAL that once grew under a burst is cut back after the next full checkpoint.
        sqlite.run("PRAGMA journal_size_limit = 67108864");
        resolve(true);
      } else if (message.type === "checkpointed") {
        const result = { log: message.log ?? 0, checkpointed: message.checkpointed ?? 0 };
        options.onCheckpoint?.(result);
        if (active && writes && result.log >= restartAtFrames) restart.begin();
      } else if (message.type === "prepared") {
        restart.prepared(message.failed === true, message.syncMs ?? 0);
      } else if (message.type === "caught-up") {
        restart.end(!message.failed && message.log === message.checkpointed, message.ms ?? 0);
      } else if (message.type === "error") {
        reportError(message.message ?? "unknown error");
      } else if (message.type === "unavailable") {
        URL.revokeObjectURL(url);
        workerRunning = false;
        reportError(`cannot open the store: ${message.message ?? "unknown error"}`);
        resolve(false);
      } else if (message.type === "stopped") stopped?.();
    };
    worker.onerror = () => {
      URL.revokeObjectURL(url);
      workerRunning = false;
      resolve(false);
    };
  });
  worker.postMessage({ type: "start", path, databaseFd, intervalMs: options.intervalMs ?? 100 });
  // The worker must not hold the process open on its own.
  (worker as Worker & { unref(): void }).unref(); // Bun's Worker has unref; the DOM typing does not
  return {
    ready,
    restartWith(hold) {
      writes = hold;
    },
    async stop() {
      if (!active) return;
      active = false;
      restart.end(false, 0);
      if (workerRunning) {
        const done = new Promise<void>((resolve) => {
          stopped = resolve;
        });
        worker.postMessage({ type: "stop" });
        await Promise.race([done, Bun.sleep(2_000)]);
      }
      worker.terminate();
      // The server connection checkpoints again (and on close) once nobody else does.
      try {
        sqlite.run("PRAGMA wal_autocheckpoint = 1000");
      } catch {
        // Already closed: closing checkpointed.
      }
    },
    closeDatabaseFile() {
      if (active) throw new Error("checkpointer: stop() before closeDatabaseFile()");
      if (databaseFd === null) return;
      closeSync(databaseFd);
      databaseFd = null;
    },
  };
}
