import { Database } from "bun:sqlite";
import { type BunSQLiteDatabase, drizzle } from "drizzle-orm/bun-sqlite";
import * as schema from "./schema/index.ts";

export type Db = BunSQLiteDatabase<typeof schema>;

export interface Store {
  sqlite: Database;
  db: Db;
  close(): void;
}

/**
 * WAL with synchronous=NORMAL: a committed transaction survives a crash of the process (kill -9);
 * only an OS crash or power loss can drop the last few. busy_timeout covers the CLI writing while
 * the server runs.
 */
export function openStore(path: string): Store {
  const sqlite = new Database(path, { create: true, strict: true });
  sqlite.run("PRAGMA journal_mode = WAL");
  sqlite.run("PRAGMA synchronous = NORMAL");
  sqlite.run("PRAGMA busy_timeout = 5000");
  sqlite.run("PRAGMA foreign_keys = ON");
  sqlite.run("PRAGMA temp_store = MEMORY");
  const db = drizzle({ client: sqlite, schema });
  return { sqlite, db, close: () => sqlite.close() };
}
