import { openStore, type Store } from "./db.ts";
import { type MigrationResult, migrate } from "./migrate.ts";

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
