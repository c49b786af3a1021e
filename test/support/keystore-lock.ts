import { Database } from "bun:sqlite";

/**
 * Holds the keystore's write lock (src/crypto/file-lock.ts) as another process would, until the
 * returned function is called: a second SQLite connection's exclusive lock on the lock file, which
 * SQLite keeps apart from this process's other connections as it does between processes.
 */
export function holdKeystoreLock(keystorePath: string): () => void {
  const db = new Database(`${keystorePath}.lock`, { create: true, strict: true });
  db.run("PRAGMA journal_mode = MEMORY");
  db.run("BEGIN EXCLUSIVE");
  return () => {
    db.run("ROLLBACK");
    db.close();
  };
}
