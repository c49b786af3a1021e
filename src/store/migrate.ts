import type { Database } from "bun:sqlite";
import { embeddedMigrations } from "./migrations.macro.ts" with { type: "macro" };
import type { EmbeddedMigration } from "./migrations.macro.ts";

const MIGRATIONS: EmbeddedMigration[] = embeddedMigrations();

/**
 * Earlier texts of shipped migrations, by tag, whose statements are the ones shipped now: a store
 * that recorded one of these hashes ran the same schema change, and is re-recorded with today's
 * hash. A shipped migration must otherwise never change (test/unit/migration-hashes.test.ts pins
 * them): its hash covers the whole file, comments too, and a store that ran another text is
 * refused for good.
 */
export const SUPERSEDED_MIGRATION_HASHES: Readonly<Record<string, readonly string[]>> = {
  // 388e61f reworded a comment; stores made or migrated between 2178809 and it recorded this.
  "0026_verification_counted": ["5eef677be02bcc9a932e37c24ff2057d702436c65cd7d156d5b2999cfca9e97e"],
};

export interface MigrationResult {
  applied: string[];
  current: string | null;
}

/**
 * The migrations {@link migrate} would write to this database: those it has not recorded, and
 * those recorded with a superseded hash (re-recorded with today's). Read only, so a caller can
 * decide before anything changes; a migration it would refuse is left for `migrate` to report.
 */
export function pendingMigrations(
  sqlite: Database,
  migrations: EmbeddedMigration[] = MIGRATIONS,
  superseded: Readonly<Record<string, readonly string[]>> = SUPERSEDED_MIGRATION_HASHES,
): string[] {
  const hasTable = sqlite
    .query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'")
    .get();
  const known = new Map(
    hasTable
      ? sqlite
          .query<{ tag: string; hash: string }, []>("SELECT tag, hash FROM schema_migrations")
          .all()
          .map((row) => [row.tag, row.hash])
      : [],
  );
  return migrations
    .filter((migration) => {
      const recorded = known.get(migration.tag);
      return (
        recorded === undefined ||
        (recorded !== migration.hash && superseded[migration.tag]?.includes(recorded))
      );
    })
    .map((migration) => migration.tag);
}

/**
 * Forward-only: each pending migration runs in its own transaction and is recorded with its hash.
 * A database that has a migration this binary does not know (a newer binary ran) is refused.
 */
export function migrate(
  sqlite: Database,
  migrations: EmbeddedMigration[] = MIGRATIONS,
  superseded: Readonly<Record<string, readonly string[]>> = SUPERSEDED_MIGRATION_HASHES,
): MigrationResult {
  sqlite.run(
    "CREATE TABLE IF NOT EXISTS schema_migrations (tag TEXT PRIMARY KEY, hash TEXT NOT NULL, applied_at INTEGER NOT NULL)",
  );
  const known = new Map(
    sqlite
      .query<{ tag: string; hash: string }, []>("SELECT tag, hash FROM schema_migrations")
      .all()
      .map((row) => [row.tag, row.hash]),
  );
  const ours = new Set(migrations.map((m) => m.tag));
  const foreign = [...known.keys()].filter((tag) => !ours.has(tag));
  if (foreign.length > 0) {
    throw new Error(
      `the database was migrated by a newer version (${foreign.join(", ")}); upgrade this binary`,
    );
  }
  const applied: string[] = [];
  for (const migration of migrations) {
    const recorded = known.get(migration.tag);
    if (recorded !== undefined) {
      if (recorded === migration.hash) continue;
      if (!superseded[migration.tag]?.includes(recorded)) {
        throw new Error(`migration ${migration.tag} differs from the one applied to this database`);
      }
      // Only when it still holds the earlier hash: another process may have re-recorded it.
      sqlite.run("UPDATE schema_migrations SET hash = ? WHERE tag = ? AND hash = ?", [
        migration.hash,
        migration.tag,
        recorded,
      ]);
      continue;
    }
    // IMMEDIATE takes the write lock before re-checking, so two processes starting on one data
    // directory apply each migration once: the second waits (busy_timeout), then finds it done.
    const ran = sqlite
      .transaction(() => {
        const done = sqlite.query("SELECT 1 FROM schema_migrations WHERE tag = ?").get(migration.tag);
        if (done) return false;
        for (const statement of migration.statements) sqlite.run(statement);
        sqlite.run("INSERT INTO schema_migrations (tag, hash, applied_at) VALUES (?, ?, ?)", [
          migration.tag,
          migration.hash,
          Date.now(),
        ]);
        return true;
      })
      .immediate();
    if (ran) applied.push(migration.tag);
  }
  return { applied, current: migrations.at(-1)?.tag ?? null };
}
