import type { Database } from "bun:sqlite";
import { getTableColumns, getTableName } from "drizzle-orm";
import type { SQLiteTable } from "drizzle-orm/sqlite-core";

// SQL built with interpolation on purpose: only from the Drizzle schema's own table and column
// names and from constant text in the calling code, once when a statement is prepared; values
// are always bound parameters, never request data in the text (test/api/security-review.test.ts).
type Binding = string | number | bigint | null;

/**
 * A whole-row read compiled once, for the hot paths: the same row object Drizzle's
 * `select().from(table)` returns (camelCase keys, JSON parsed, timestamps as Date), mapped by a
 * loop over the table's columns instead of Drizzle's generic result mapper, which cost a heartbeat
 * more than the three reads themselves (docs/performance.md). `where` is SQL with `?` parameters.
 */
export function preparedRowReader<T extends SQLiteTable, P extends Binding[]>(
  sqlite: Database,
  table: T,
  where: string,
): (...params: P) => T["$inferSelect"] | undefined {
  const columns = Object.entries(getTableColumns(table));
  const keys = columns.map(([key]) => key);
  const decoders = columns.map(([, column]) => column);
  const statement = sqlite.prepare<unknown[], Binding[]>(
    `SELECT ${columns.map(([, column]) => `"${column.name}"`).join(", ")} FROM "${getTableName(table)}" WHERE ${where}`,
  );
  return (...params) => {
    const values = statement.values(...params)[0];
    if (values === undefined) return undefined;
    const row: Record<string, unknown> = {};
    for (let i = 0; i < keys.length; i++) {
      const value = values[i];
      row[keys[i] as string] =
        value === null ? null : (decoders[i] as (typeof decoders)[number]).mapFromDriverValue(value);
    }
    return row as T["$inferSelect"];
  };
}
