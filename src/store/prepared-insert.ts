import type { Database } from "bun:sqlite";
import { getTableColumns, getTableName } from "drizzle-orm";
import type { SQLiteTable } from "drizzle-orm/sqlite-core";

/**
 * An INSERT of a whole row, compiled once. Drizzle's `insert().values()` builds its SQL on every
 * call (~80 µs for an activation, more than its commit); and its prepared form with placeholders
 * hands null to the column mappers. Values go through each column's own `mapToDriverValue`
 * (JSON, timestamps, booleans), as Drizzle would convert them; null and undefined are NULL.
 */
// SQL built with interpolation on purpose: only from the Drizzle schema's own table and column
// names and from constant text in the calling code, once when a statement is prepared; values
// are always bound parameters, never request data in the text (test/api/security-review.test.ts).
export function preparedInsert<T extends SQLiteTable>(
  sqlite: Database,
  table: T,
): (row: T["$inferInsert"]) => void {
  const columns = Object.entries(getTableColumns(table));
  const statement = sqlite.prepare(
    `INSERT INTO "${getTableName(table)}" (${columns.map(([, column]) => `"${column.name}"`).join(", ")})
     VALUES (${columns.map(() => "?").join(", ")})`,
  );
  return (row) => {
    const values = columns.map(([key, column]) => {
      const value = (row as Record<string, unknown>)[key];
      return value === null || value === undefined ? null : column.mapToDriverValue(value);
    });
    // bun:sqlite binds what mappers return (string, number, bigint, Uint8Array, null).
    statement.run(...(values as (string | number | bigint | Uint8Array | null)[]));
  };
}
