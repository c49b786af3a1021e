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
 * The worker's source is inlined (a Blob URL) so the compiled executable needs no extra file.
 */
const WORKER_SOURCE = `
import { Database } from "bun:sqlite";
let db;
let timer;
function checkpoint() {
  try {
    const [row] = db.query("PRAGMA wal_checkpoint(PASSIVE)").all();
    postMessage({ type: "checkpointed", log: row.log, checkpointed: row.checkpointed });
  } catch (error) {
    // SQLITE_BUSY and friends: the next tick tries again.
    postMessage({ type: "error", message: String(error && error.message || error) });
  }
}
self.onmessage = (event) => {
  const message = event.data;
  if (message.type === "start") {
    db = new Database(message.path);
    db.run("PRAGMA busy_timeout = 1000");
    timer = setInterval(checkpoint, message.intervalMs);
    postMessage({ type: "started" });
  } else if (message.type === "stop") {
    clearInterval(timer);
    try { db && db.close(); } catch {}
    postMessage({ type: "stopped" });
  }
};
`;

export interface CheckpointerOptions {
  /** How often the worker checkpoints. A heartbeat writes a few pages; 250 ms keeps the WAL small. */
  intervalMs?: number;
  /** Called with each checkpoint's result, for tests and metrics. */
  onCheckpoint?: (result: { log: number; checkpointed: number }) => void;
}

export interface Checkpointer {
  /** True once the worker runs and the server connection has stopped checkpointing itself. */
  ready: Promise<boolean>;
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
  const ready = new Promise<boolean>((resolve) => {
    worker.onmessage = (event: MessageEvent) => {
      const message = event.data as { type: string; log?: number; checkpointed?: number };
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
      } else if (message.type === "checkpointed")
        options.onCheckpoint?.({ log: message.log ?? 0, checkpointed: message.checkpointed ?? 0 });
      else if (message.type === "stopped") stopped?.();
    };
    worker.onerror = () => {
      URL.revokeObjectURL(url);
      resolve(false);
    };
  });
  worker.postMessage({ type: "start", path, intervalMs: options.intervalMs ?? 250 });
  // The worker must not hold the process open on its own.
  (worker as Worker & { unref(): void }).unref(); // Bun's Worker has unref; the DOM typing does not
  return {
    ready,
    async stop() {
      if (!active) return;
      active = false;
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
