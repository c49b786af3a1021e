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

/**
 * Several tables' whole rows in one statement (a row per table, or undefined where a LEFT JOIN
 * found none), each mapped as `preparedRowReader` maps it. `from` names every table by its alias,
 * e.g. `activations a LEFT JOIN licenses l ON l.id = a.license_id ... WHERE a.id = ?`. One SQLite
 * step instead of one per table: the device calls read activation, license and policy together.
 */
export function preparedJoinReader<
  const T extends readonly { alias: string; table: SQLiteTable }[],
  P extends Binding[],
>(
  sqlite: Database,
  parts: T,
  from: string,
): (...params: P) => { [K in keyof T]: T[K]["table"]["$inferSelect"] | undefined } | undefined {
  const layout = parts.map(({ alias, table }) => ({
    alias,
    columns: Object.entries(getTableColumns(table)).map(([key, column]) => ({ key, column })),
  }));
  const select = layout
    .flatMap(({ alias, columns }) => columns.map(({ column }) => `${alias}."${column.name}"`))
    .join(", ");
  const statement = sqlite.prepare<unknown[], Binding[]>(`SELECT ${select} FROM ${from}`);
  type Result = { [K in keyof T]: T[K]["table"]["$inferSelect"] | undefined };
  return (...params) => {
    const values = statement.values(...params)[0];
    if (values === undefined) return undefined;
    let i = 0;
    const rows = layout.map(({ columns }) => {
      // A LEFT JOIN that found nothing leaves every column NULL, the primary key included.
      const present = values[i] !== null;
      const row: Record<string, unknown> = {};
      for (const { key, column } of columns) {
        const value = values[i++];
        row[key] = value === null ? null : column.mapFromDriverValue(value);
      }
      return present ? row : undefined;
    });
    return rows as unknown as Result;
  };
}
