import { closeSync, openSync, readFileSync, statSync, unlinkSync, writeSync } from "node:fs";

const LOCK_WAIT_MS = 5_000;
/** A lock older than this was left by a process that died while holding it. */
const STALE_LOCK_MS = 30_000;

/**
 * An exclusive lock file (O_EXCL) around a keystore write, shared by every process on the data
 * dir. It holds the holder's pid, so a lock left by a process that was killed (kill -9, OOM) is
 * taken over at once instead of blocking keystore writes, and the restarted server, for 30 s.
 */
export function withLock<T>(lockPath: string, work: () => T, timedOut: () => Error): T {
  const deadline = Date.now() + LOCK_WAIT_MS;
  for (;;) {
    try {
      const fd = openSync(lockPath, "wx", 0o600);
      try {
        writeSync(fd, String(process.pid));
      } finally {
        closeSync(fd);
      }
      break;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      try {
        if (lockIsStale(lockPath)) unlinkSync(lockPath);
      } catch {
        // The holder released it between our calls; try again.
      }
      if (Date.now() > deadline) throw timedOut();
      Bun.sleepSync(10);
    }
  }
  try {
    return work();
  } finally {
    unlinkSync(lockPath);
  }
}

/**
 * Old enough, or its holder is gone. The holder is a process on this machine (the data dir is
 * local); a lock bearing this process's own pid is stale too, since keystore writes are
 * synchronous and never nest (a container restarts its server with the same pid). A lock without
 * a pid yet (its holder between create and write) is judged by age only.
 */
function lockIsStale(lockPath: string): boolean {
  if (Date.now() - statSync(lockPath).mtimeMs > STALE_LOCK_MS) return true;
  const pid = Number(readFileSync(lockPath, "utf8"));
  if (!Number.isInteger(pid) || pid <= 0) return false;
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
    return false;
  } catch (error) {
    // EPERM: alive, run by another user.
    return (error as NodeJS.ErrnoException).code === "ESRCH";
  }
}
