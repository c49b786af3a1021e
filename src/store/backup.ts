import { Database } from "bun:sqlite";
import { createHash } from "node:crypto";
import { closeSync, fsyncSync, openSync, readSync, statSync } from "node:fs";
import { type Keystore, PRODUCT_SEALING_PREFIX, PRODUCT_SIGNING_PREFIX } from "../crypto/keystore.ts";
import { SecretBox } from "../crypto/secret-box.ts";
import { undecryptableValue } from "./data-key.ts";

/**
 * The store half of `licensing backup` and `licensing restore`: a consistent snapshot of a live
 * store, and the checks that a snapshot (or a restored store) really is usable with its keystore.
 */
export const BACKUP_FORMAT = "licensing-backup-v1";
export const MANIFEST_NAME = "backup.json";

export interface BackupFile {
  sha256: string;
  bytes: number;
}

export interface BackupManifest {
  format: typeof BACKUP_FORMAT;
  created_at: string;
  licensing_version: string;
  /** Migration tags recorded in the snapshot, oldest first. */
  schema: string[];
  files: Record<string, BackupFile>;
  /** Rows per table in the snapshot, so an operator can see what a backup holds without opening it. */
  rows: Record<string, number>;
  passphrase_included: boolean;
}

/**
 * `VACUUM INTO` runs inside one read transaction, so the copy is the store exactly as it was at
 * one commit, including everything committed to the WAL and not yet checkpointed. In WAL mode a
 * reader blocks no writer: a running server keeps answering while it is taken. The output is a
 * single rollback-journal file (no -wal/-shm beside it), fsynced before this returns.
 */
export function snapshotStore(livePath: string, outPath: string): void {
  // No migration and no schema change: a backup must never alter the store it copies, even when
  // this binary is newer than the server that owns it.
  const live = new Database(livePath, { readwrite: true, create: false });
  try {
    live.run("PRAGMA busy_timeout = 5000");
    live.run("VACUUM INTO ?", [outPath]);
  } finally {
    live.close();
  }
  fsyncFile(outPath);
}

/**
 * Tables whose rows name a private key in the keystore, the keystore id prefix of each, and which
 * rows need it: a compromised sealing key's private half is removed on purpose (and only after
 * the store says compromised), so the store no longer needs it.
 */
const KEYSTORE_ENTRIES: Record<string, { prefix: string; needed: string }> = {
  signing_keys: { prefix: PRODUCT_SIGNING_PREFIX, needed: "1" },
  sealing_keys: { prefix: PRODUCT_SEALING_PREFIX, needed: "status <> 'compromised'" },
};

export interface StoreReport {
  schema: string[];
  rows: Record<string, number>;
}

/**
 * A store is usable with a keystore when SQLite finds no corruption and no row that refers to a
 * row the store lacks (the service enforces foreign keys, so only a store changed outside it has
 * one), the keystore's data key decrypts the store's secrets (data-key.ts), and every product
 * signing or sealing key it lists has its private half in the keystore (except compromised
 * sealing keys). A
 * key goes into the keystore before its row goes into the store, and the only entries ever
 * removed are those of sealing keys the store already calls compromised, so a keystore copied
 * after the store snapshot passes; one copied before can miss keys made in between, and one
 * copied just after a compromise that the snapshot predates lacks that key (run the backup again).
 */
export function checkStore(sqlite: Database, keystore: Keystore | null): StoreReport {
  const integrity = sqlite.query<{ integrity_check: string }, []>("PRAGMA integrity_check").all();
  const verdict = integrity.map((row) => row.integrity_check).join("; ");
  if (verdict !== "ok") throw new Error(`the store is damaged: ${verdict}`);
  const orphans = sqlite
    .query<{ table: string; rowid: number | null; parent: string }, []>("PRAGMA foreign_key_check")
    .all();
  const [orphan] = orphans;
  if (orphan) {
    throw new Error(
      `the store is damaged: ${orphans.length} row(s) refer to rows it does not hold ` +
        `(the first: row ${orphan.rowid ?? "?"} of ${orphan.table}, whose ${orphan.parent} row is missing)`,
    );
  }
  const tables = sqlite
    .query<{ name: string }, []>(
      "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )
    .all()
    .map((row) => row.name);
  if (!tables.includes("schema_migrations")) throw new Error("the file is not a licensing store");
  const rows: Record<string, number> = {};
  for (const table of tables) {
    // Table names come from sqlite_master of this very file; quoted so any name is one identifier.
    const count = sqlite.query<{ n: number }, []>(
      `SELECT count(*) AS n FROM "${table.replaceAll('"', '""')}"`,
    );
    rows[table] = count.get()?.n ?? 0;
  }
  const schema = sqlite
    .query<{ tag: string }, []>("SELECT tag FROM schema_migrations ORDER BY tag")
    .all()
    .map((row) => row.tag);
  if (keystore) {
    if (!keystore.has("data-key")) throw new Error("the keystore has no data key");
    const missing = Object.entries(KEYSTORE_ENTRIES)
      .filter(([table]) => tables.includes(table))
      .flatMap(([table, { prefix, needed }]) =>
        sqlite
          // The table name and condition come from the constant map above, never from input.
          .query<{ key_id: string }, []>(`SELECT key_id FROM "${table}" WHERE ${needed} ORDER BY key_id`)
          .all()
          .map((row) => `${prefix}${row.key_id}`),
      )
      .filter((entry) => !keystore.has(entry));
    if (missing.length > 0) {
      throw new Error(
        `the keystore lacks the private half of key(s) ${missing.join(", ")} that the store lists; ` +
          "the two do not belong together",
      );
    }
    const unreadable = undecryptableValue(sqlite, new SecretBox(keystore.secret("data-key")));
    if (unreadable) {
      throw new Error(
        `the keystore's data key does not decrypt the store's secrets (${unreadable}); ` +
          "the two do not belong together",
      );
    }
  }
  return { schema, rows };
}

/** How much of a file describeFile holds at once. */
export const DESCRIBE_CHUNK_BYTES = 1024 * 1024;

/**
 * SHA-256 and size of a file, read in chunks through one reused buffer: memory stays at one chunk
 * whatever the size of the store (a whole-file read needs the store's size in memory, and fails
 * past 4 GiB). `chunkBytes` is for tests, to cross chunk boundaries with a small file.
 */
export function describeFile(path: string, chunkBytes = DESCRIBE_CHUNK_BYTES): BackupFile {
  const hash = createHash("sha256");
  const buffer = Buffer.allocUnsafe(chunkBytes);
  let bytes = 0;
  const fd = openSync(path, "r");
  try {
    for (;;) {
      const read = readSync(fd, buffer, 0, chunkBytes, null);
      if (read === 0) break;
      hash.update(buffer.subarray(0, read));
      bytes += read;
    }
  } finally {
    closeSync(fd);
  }
  return { sha256: hash.digest("hex"), bytes };
}

export function fsyncFile(path: string): void {
  const fd = openSync(path, statSync(path).isDirectory() ? "r" : "r+");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** The manifest as written by `backup`; anything else is refused before a byte is restored. */
export function parseManifest(text: string): BackupManifest {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new Error(`${MANIFEST_NAME} is not valid JSON (truncated or corrupted)`);
  }
  const m = value as Partial<BackupManifest> | null;
  const filesOk =
    typeof m?.files === "object" &&
    m.files !== null &&
    Object.values(m.files).every(
      (f) => typeof f?.sha256 === "string" && /^[0-9a-f]{64}$/.test(f.sha256) && Number.isInteger(f.bytes),
    );
  if (
    m?.format !== BACKUP_FORMAT ||
    !filesOk ||
    !Array.isArray(m.schema) ||
    typeof m.passphrase_included !== "boolean"
  ) {
    throw new Error(`${MANIFEST_NAME} is not a ${BACKUP_FORMAT} manifest`);
  }
  return m as BackupManifest;
}
