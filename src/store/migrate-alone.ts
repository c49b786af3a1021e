import { openStore, type Store } from "./db.ts";
import { type MigrationResult, migrate, pendingMigrations } from "./migrate.ts";

/** Migrations are pending, and another connection (a process, or this one) has the store open. */
export class StoreOpenElsewhere extends Error {
  constructor() {
    super("another connection has the store open");
    this.name = "StoreOpenElsewhere";
  }
}

/**
 * Runs the pending migrations over a connection that has the store to itself, and keeps every
 * other out until they are done. Whoever has the store open while it still needs migrations is
 * older than this executable (a server, or a command): migrating under it would leave the rows it
 * writes afterwards without what the new columns mean, and stop it from starting again. Every open
 * connection holds a shared lock on the store, so the exclusive open fails at once while one does.
 */
export function migrateAlone(path: string): MigrationResult {
  let store: Store;
  try {
    store = openStore(path, { alone: true });
  } catch (error) {
    if ((error as { code?: string }).code === "SQLITE_BUSY") throw new StoreOpenElsewhere();
    throw error;
  }
  try {
    return migrate(store.sqlite);
  } finally {
    store.close();
  }
}

/**
 * Opens the store at `path` with its schema up to date, for `serve` and the commands alike. With
 * nothing pending it migrates in place (which writes nothing, and still refuses a store a newer
 * version migrated), so a command works beside a running server. Otherwise this connection is
 * closed (it would count as another's) and the migrations run alone (migrateAlone), wrapped in
 * `whileAlone` (the command line keeps a server from starting meanwhile); then the store is
 * opened again.
 */
export function openMigratedStore(
  path: string,
  whileAlone: (migrateNow: () => MigrationResult) => MigrationResult = (migrateNow) => migrateNow(),
): { store: Store; result: MigrationResult } {
  const store = openStore(path);
  try {
    if (pendingMigrations(store.sqlite).length === 0) return { store, result: migrate(store.sqlite) };
  } catch (error) {
    store.close();
    throw error;
  }
  store.close();
  const result = whileAlone(() => migrateAlone(path));
  return { store: openStore(path), result };
}
