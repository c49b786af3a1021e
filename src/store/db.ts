import { Database, type Statement } from "bun:sqlite";
import { closeSync, openSync, readSync } from "node:fs";
import { type BunSQLiteDatabase, drizzle } from "drizzle-orm/bun-sqlite";
import * as schema from "./schema/index.ts";

export type Db = BunSQLiteDatabase<typeof schema>;

export interface Store {
  sqlite: Database;
  db: Db;
  close(): void;
}

export interface OpenStoreOptions {
  /**
   * Open the store only if no other connection has it open, in this process or another, and keep
   * every other out until this one closes (SQLite's exclusive locking mode; WAL works on without
   * shared memory). Throws SQLITE_BUSY at once when another has it open.
   */
  alone?: boolean;
}

/**
 * WAL with synchronous=NORMAL: a committed transaction survives a crash of the process (kill -9);
 * only an OS crash or power loss can drop the last few. busy_timeout covers the CLI writing while
 * the server runs.
 */
export function openStore(path: string, options: OpenStoreOptions = {}): Store {
  const sqlite = new Database(path, { create: true, strict: true });
  if (options.alone) {
    try {
      // Before the first access, which takes the lock: every open connection holds a shared one.
      sqlite.run("PRAGMA busy_timeout = 0");
      sqlite.run("PRAGMA locking_mode = EXCLUSIVE");
      sqlite.query("SELECT count(*) FROM sqlite_master").get();
    } catch (error) {
      sqlite.close();
      throw error;
    }
  }
  sqlite.run("PRAGMA journal_mode = WAL");
  sqlite.run("PRAGMA synchronous = NORMAL");
  sqlite.run("PRAGMA busy_timeout = 5000");
  sqlite.run("PRAGMA foreign_keys = ON");
  sqlite.run("PRAGMA temp_store = MEMORY");
  // 64 MiB of page cache (SQLite's default is 2 MiB), taken only as pages are read: with a
  // million activations the B-tree interior pages of the hot tables then stay in memory, and a
  // heartbeat reads only its own leaf pages from the file (docs/performance.md, scale).
  sqlite.run("PRAGMA cache_size = -65536");
  const db = drizzle({ client: withStatementCache(sqlite), schema });
  // Every transaction takes the write lock before it reads (BEGIN IMMEDIATE), so the busy timeout
  // covers another process writing (the command line, whose even read-only commands take it for a
  // moment). A deferred transaction that has read and then writes gets SQLITE_BUSY at once, with
  // no wait (SQLite skips the busy handler there to avoid a deadlock): each management write
  // landing in such a moment answered 503. The bun:sqlite transactions call .immediate() likewise.
  const deferredByDefault = db.transaction.bind(db);
  db.transaction = ((work, config) =>
    deferredByDefault(work, { behavior: "immediate", ...config })) as Db["transaction"];
  return { sqlite, db, close: () => sqlite.close() };
}

/** The first 16 bytes of every SQLite database file. */
const SQLITE_HEADER = "SQLite format 3\0";

/**
 * Why the existing file at `path` cannot be a store that was ever initialised, or null when it
 * can. Checked before `openStore`, which would take an empty or blank file for a new store (SQLite
 * opens a 0-byte file as an empty database, and migrations would fill it with a blank workspace,
 * hiding that the real store was lost) and would write to it. Read only: the schema is looked at
 * through a read-only connection, and a file that is not SQLite is not opened at all.
 */
export function unusableStoreFile(path: string): string | null {
  const header = Buffer.alloc(SQLITE_HEADER.length);
  const fd = openSync(path, "r");
  let read: number;
  try {
    read = readSync(fd, header, 0, header.length, 0);
  } finally {
    closeSync(fd);
  }
  if (read === 0) return "is empty (0 bytes)";
  if (read < header.length || header.toString("latin1") !== SQLITE_HEADER) return "is not a SQLite database";
  let tables: number;
  try {
    const sqlite = new Database(path, { readonly: true });
    try {
      tables = sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM sqlite_master").get()?.n ?? 0;
    } finally {
      sqlite.close();
    }
  } catch {
    // Unreadable as a database (corrupt): opening it for real reports SQLite's own reason.
    return null;
  }
  return tables === 0 ? "has no tables (a blank database)" : null;
}

/** Distinct SQL texts kept compiled; the app has a few hundred query shapes. */
const STATEMENT_CACHE_SIZE = 2_000;

/**
 * Drizzle compiles a fresh SQLite statement for every query it runs (`client.prepare`), which on
 * the activation path cost more than the signatures (docs/performance.md). This client hands it
 * an already compiled statement for SQL it has seen before, so an unprepared Drizzle query costs
 * only its SQL building. Safe because Drizzle runs each statement to completion before returning
 * (no iterators) and never finalizes one; the oldest entries are dropped beyond the bound, so
 * queries with variable-length IN lists cannot grow it without end.
 */
function withStatementCache(sqlite: Database): Database {
  const cache = new Map<string, Statement>();
  const prepare = (sql: string) => {
    let statement = cache.get(sql);
    if (statement) return statement;
    statement = sqlite.prepare(sql);
    // Forgotten, not finalized: a query prepared once with Drizzle's .prepare() may still hold it.
    if (cache.size >= STATEMENT_CACHE_SIZE) cache.delete(cache.keys().next().value as string);
    cache.set(sql, statement);
    return statement;
  };
  return new Proxy(sqlite, {
    get(target, property) {
      if (property === "prepare") return prepare;
      const value = Reflect.get(target, property, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** The statement that puts each `PRAGMA synchronous` level back (SQL stays constant text). */
const SET_SYNCHRONOUS = [
  "PRAGMA synchronous = OFF",
  "PRAGMA synchronous = NORMAL",
  "PRAGMA synchronous = FULL",
  "PRAGMA synchronous = EXTRA",
] as const;

/**
 * Runs `work` with every commit synced to disk (`synchronous = FULL`: in WAL mode a commit then
 * fsyncs the log), then restores the connection's setting. For the rare commit that something
 * irreversible follows, such as deleting a private key: under the store's `synchronous = NORMAL`
 * a power loss may roll the last commits back.
 */
export function withSyncedCommits<T>(sqlite: Database, work: () => T): T {
  const previous = sqlite.query<{ synchronous: number }, []>("PRAGMA synchronous").get()?.synchronous ?? 1;
  sqlite.exec("PRAGMA synchronous = FULL");
  try {
    return work();
  } finally {
    sqlite.exec(SET_SYNCHRONOUS[previous] ?? "PRAGMA synchronous = NORMAL");
  }
}
