import { Database } from "bun:sqlite";

/**
 * One `licensing serve` per data directory. Two would keep the data correct (every write takes
 * the store's write lock) but count rate limits and the monthly allowances each on its own, so
 * together they would grant twice the plan. The lock is SQLite's own exclusive lock on a small
 * file beside the store, held for the server's life: the operating system lets go of it when the
 * process ends in any way (kill -9 included), so a crash never leaves a stale lock behind.
 */
export interface ServeLock {
  release(): void;
}

/** Takes the lock, or returns null when another process holds it. */
export function takeServeLock(path: string): ServeLock | null {
  const db = new Database(path, { create: true, strict: true });
  try {
    db.run("PRAGMA busy_timeout = 0");
    // Nothing is ever written to it: without this, the lock left a `serve.lock-journal` beside it.
    db.run("PRAGMA journal_mode = MEMORY");
    db.run("BEGIN EXCLUSIVE");
  } catch (error) {
    db.close();
    if ((error as { code?: string }).code === "SQLITE_BUSY") return null;
    throw error;
  }
  let held = true;
  return {
    release() {
      if (!held) return;
      held = false;
      db.run("ROLLBACK");
      db.close();
    },
  };
}
