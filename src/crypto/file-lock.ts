import { Database } from "bun:sqlite";
import { readFileSync, statSync, unlinkSync } from "node:fs";

/**
 * An exclusive lock around a keystore write, shared by every process on the data dir: SQLite's
 * own lock (a POSIX record lock) on a small file beside the keystore, as `serve.lock` is. The
 * kernel holds it for the process and lets go when the process ends in any way (kill -9, OOM), so
 * nothing is ever stale; and it holds across PID namespaces, where a pid written into a lock file
 * means nothing (a command in one container and the server in another, each PID 1, sharing the
 * data volume). A holder is waited for up to 5 s, then `timedOut()` is thrown.
 */
export function withLock<T>(lockPath: string, work: () => T, timedOut: () => Error): T {
  // A lock file of an older version (a pid in text, created and deleted around each write) is
  // not a database: one left by a crash is removed. Nothing of this version writes such a file.
  if (isOldLockFile(lockPath)) unlinkSync(lockPath);
  const db = new Database(lockPath, { create: true, strict: true });
  try {
    try {
      // First: setting the journal mode already waits for a holder's lock.
      // A holder is waited for up to 5 s (a literal: no SQL here is built from values).
      db.run("PRAGMA busy_timeout = 5000");
      // Nothing is ever written to it: without this, each lock left a `-journal` file beside it.
      db.run("PRAGMA journal_mode = MEMORY");
      db.run("BEGIN EXCLUSIVE");
    } catch (error) {
      if ((error as { code?: string }).code === "SQLITE_BUSY") throw timedOut();
      throw error;
    }
    try {
      return work();
    } finally {
      db.run("ROLLBACK");
    }
  } finally {
    db.close();
  }
}

function isOldLockFile(lockPath: string): boolean {
  try {
    const { size } = statSync(lockPath);
    return size > 0 && size < 32 && /^\d*$/.test(readFileSync(lockPath, "utf8"));
  } catch {
    return false;
  }
}
