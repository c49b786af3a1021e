import type { Database } from "bun:sqlite";

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
import { closeSync, fdatasyncSync, openSync } from "node:fs";
let db;
let databaseFd;
let timer;
function checkpoint(type, syncDatabase) {
  try {
    const started = performance.now();
    const [row] = db.query("PRAGMA wal_checkpoint(PASSIVE)").all();
    let syncMs;
    if (syncDatabase) {
      const syncStarted = performance.now();
      fdatasyncSync(databaseFd);
      syncMs = performance.now() - syncStarted;
    }
    postMessage({ type, log: row.log, checkpointed: row.checkpointed, ms: performance.now() - started, syncMs });
  } catch (error) {
    // SQLITE_BUSY and friends: the next tick tries again.
    postMessage({ type: "error", message: String(error && error.message || error) });
    // A restart step waits for its answer: say it failed rather than leave it waiting.
    if (type !== "checkpointed") postMessage({ type, failed: true });
  }
}
self.onmessage = (event) => {
  const message = event.data;
  if (message.type === "prepare") {
    checkpoint("prepared", true);
  } else if (message.type === "catch-up") {
    checkpoint("caught-up", false);
  } else if (message.type === "start") {
    db = new Database(message.path);
    db.run("PRAGMA busy_timeout = 1000");
    databaseFd = openSync(message.path, "r");
    timer = setInterval(() => checkpoint("checkpointed", false), message.intervalMs);
    postMessage({ type: "started" });
  } else if (message.type === "stop") {
    clearInterval(timer);
    try { db && db.close(); } catch {}
    try { databaseFd !== undefined && closeSync(databaseFd); } catch {}
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
   * fsyncs of little data, 1-5 ms here), so fewer restarts mean fewer held calls; the file stays under 40 MiB.
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
}

/** The longest writes are ever held, whatever the worker does (it may have died). */
const MAX_HOLD_MS = 50;

export interface Checkpointer {
  /** True once the worker runs and the server connection has stopped checkpointing itself. */
  ready: Promise<boolean>;
  /** From now on, hold these writes to restart the WAL (they exist only after start-up). */
  restartWith(writes: WriteHold): void;
  stop(): Promise<void>;
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
  let stopped: (() => void) | undefined;
  let writes = options.writes;
  const restartAtFrames = options.restartAtFrames ?? 8_000;
  // One restart at a time, in two steps. "prepare": the worker checkpoints once more without any
  // hold and syncs the database file, so little is left that is not yet in the database file or
  // not yet synced; "catch-up": writes are held while it checkpoints that little (its fsyncs are
  // short because little is dirty), and released on its answer. The database sync is the prepare
  // step's main work: SQLite syncs the database file only in a checkpoint that backfills the whole
  // WAL, which the periodic ones under load never do, so every page copied since the last restart
  // (~1 s of writes) was still dirty and the held catch-up flushed it all: 7-17 ms instead of 1-5.
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
      } else if (message.type === "stopped") stopped?.();
    };
    worker.onerror = () => {
      URL.revokeObjectURL(url);
      resolve(false);
    };
  });
  worker.postMessage({ type: "start", path, intervalMs: options.intervalMs ?? 100 });
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
      const done = new Promise<void>((resolve) => {
        stopped = resolve;
      });
      worker.postMessage({ type: "stop" });
      await Promise.race([done, Bun.sleep(2_000)]);
      worker.terminate();
      // The server connection checkpoints again (and on close) once nobody else does.
      try {
        sqlite.run("PRAGMA wal_autocheckpoint = 1000");
      } catch {
        // Already closed: closing checkpointed.
      }
    },
  };
}
