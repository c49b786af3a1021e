import type { Database } from "bun:sqlite";
import { is } from "drizzle-orm";
import { getTableConfig, SQLiteTable } from "drizzle-orm/sqlite-core";
import * as schema from "../../src/store/schema/index.ts";

/**
 * Writing representative rows into a store at ANY schema with plain SQL, for the upgrade test from
 * every previous schema (test/integration/upgrade-every-schema.test.ts). Nothing here knows a
 * table or a migration by name: columns come from `PRAGMA table_info` of the schema at hand, so a
 * migration added later is covered without touching this file.
 *
 * Values come from exemplar rows (a store at the current schema filled through the app, so
 * ciphertexts, JSON, enum values and ids are real), projected onto the columns the old schema
 * has. A table the exemplar has no row for, or a NOT NULL column it has no value for, gets a
 * plausible value of the column's type (enum, JSON, time, flag, number, text, bytes, from the
 * Drizzle schema where it still describes the column), and foreign keys point at existing rows.
 */

export type Value = string | number | bigint | null | Uint8Array;
export type Row = Record<string, Value>;

interface ColumnInfo {
  name: string;
  type: string;
  notnull: number;
  dflt_value: string | null;
  pk: number;
}
interface ForeignKey {
  id: number;
  table: string;
  from: string;
  to: string | null;
}

const quote = (name: string) => `"${name.replaceAll('"', '""')}"`;

export const tablesOf = (sqlite: Database): string[] =>
  sqlite
    .query<{ name: string }, []>(
      "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> 'schema_migrations' ORDER BY name",
    )
    .all()
    .map((row) => row.name);

export const columnsOf = (sqlite: Database, table: string): ColumnInfo[] =>
  sqlite.query<ColumnInfo, []>(`PRAGMA table_info(${quote(table)})`).all();

const foreignKeysOf = (sqlite: Database, table: string): ForeignKey[] =>
  sqlite.query<ForeignKey, []>(`PRAGMA foreign_key_list(${quote(table)})`).all();

/**
 * Tables that insert triggers write (e.g. counts kept per license): rows appear there by
 * themselves when the tables they follow are filled. A table only update triggers write (a
 * license's state history) is filled like any other: filling inserts, it never updates.
 */
export function triggerKeptTables(sqlite: Database): Set<string> {
  const kept = new Set<string>();
  const triggers = sqlite
    .query<{ sql: string }, []>("SELECT sql FROM sqlite_master WHERE type = 'trigger'")
    .all();
  for (const { sql } of triggers) {
    const begin = sql.search(/\bBEGIN\b/i);
    if (!/\b(?:AFTER|BEFORE)\s+INSERT\b/i.test(sql.slice(0, begin))) continue;
    // A trigger that writes the table it is on (policies' revision) keeps nothing derived.
    const own = /\bON\s+[`"[]?(\w+)/i.exec(sql.slice(0, begin))?.[1];
    const body = sql.slice(begin);
    for (const match of body.matchAll(
      /\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM)\s+[`"[]?(\w+)/gi,
    ))
      if (match[1] !== own) kept.add(match[1] as string);
  }
  return kept;
}

/** Parents before children, so rows can point at rows that already exist. */
function inDependencyOrder(sqlite: Database, tables: string[]): string[] {
  const ordered: string[] = [];
  const visiting = new Set<string>();
  const visit = (table: string) => {
    if (ordered.includes(table) || visiting.has(table)) return;
    visiting.add(table);
    for (const fk of foreignKeysOf(sqlite, table))
      if (fk.table !== table && tables.includes(fk.table)) visit(fk.table);
    ordered.push(table);
  };
  for (const table of tables) visit(table);
  return ordered;
}

/** What the current Drizzle schema says of a column, if it still has it: enum values and value kind. */
const drizzleColumns = new Map<string, { enumValues?: readonly string[]; dataType: string }>();
for (const value of Object.values(schema)) {
  if (!is(value, SQLiteTable)) continue;
  const config = getTableConfig(value);
  for (const column of config.columns) {
    drizzleColumns.set(`${config.name}.${column.name}`, {
      enumValues: column.enumValues,
      dataType: column.dataType,
    });
  }
}

/** A plausible value of the column's type, distinct per table, column and `n` (for unique indexes). */
function typedValue(table: string, column: ColumnInfo, n: number): Value {
  const known = drizzleColumns.get(`${table}.${column.name}`);
  if (known?.enumValues && known.enumValues.length > 0) return known.enumValues[0] as string;
  switch (known?.dataType) {
    case "json":
      return "{}";
    case "date":
      return Date.UTC(2026, 0, 15, 12, 0, 0) + n;
    case "boolean":
      return 0;
    case "number":
    case "bigint":
      return n + 1;
    case "buffer":
      return new Uint8Array([1, 2, 3, n & 255]);
    case "string":
      return `${table}.${column.name}.${n}`;
  }
  const type = column.type.toUpperCase();
  if (type.includes("INT")) return n + 1;
  if (type.includes("REAL") || type.includes("FLOA") || type.includes("DOUB")) return n + 0.5;
  if (type.includes("BLOB")) return new Uint8Array([1, 2, 3, n & 255]);
  return `${table}.${column.name}.${n}`;
}

function insert(sqlite: Database, table: string, row: Row): void {
  const names = Object.keys(row);
  const sql =
    names.length === 0
      ? `INSERT INTO ${quote(table)} DEFAULT VALUES`
      : `INSERT INTO ${quote(table)} (${names.map(quote).join(", ")}) VALUES (${names.map(() => "?").join(", ")})`;
  try {
    sqlite.prepare(sql).run(...(Object.values(row) as never[]));
  } catch (error) {
    throw new Error(`writing a row into ${table} at this schema: ${(error as Error).message}`);
  }
}

/** A generic row: every column that needs a value gets one; foreign keys point at existing parent rows. */
function genericRow(sqlite: Database, table: string, columns: ColumnInfo[], n: number): Row {
  const row: Row = {};
  for (const fk of foreignKeysOf(sqlite, table)) {
    const column = columns.find((c) => c.name === fk.from);
    if (!column || (column.notnull === 0 && column.pk === 0)) continue;
    const to = fk.to ?? "rowid";
    const parent = sqlite
      .query<Row, []>(`SELECT ${quote(to)} AS v FROM ${quote(fk.table)} ORDER BY rowid LIMIT 1 OFFSET ${n}`)
      .get();
    const fallback = sqlite.query<Row, []>(`SELECT ${quote(to)} AS v FROM ${quote(fk.table)} LIMIT 1`).get();
    row[fk.from] = (parent ?? fallback)?.v ?? typedValue(table, column, n);
  }
  const integerKey =
    columns.filter((c) => c.pk > 0).length === 1 &&
    columns.some((c) => c.pk > 0 && /^INTEGER$/i.test(c.type));
  for (const column of columns) {
    if (column.name in row) continue;
    if (integerKey && column.pk > 0) continue;
    if ((column.notnull === 1 && column.dflt_value === null) || column.pk > 0)
      row[column.name] = typedValue(table, column, n);
  }
  return row;
}

export interface Filled {
  /** Rows written per table. */
  written: Map<string, number>;
  /** Tables that got only a generic row, children first (the order to empty them in). */
  generic: string[];
}

/**
 * Writes rows into every table of the store's schema (except trigger-kept ones): the exemplar's
 * rows projected onto the columns this schema has, or a generic row where the exemplar has none.
 */
export function fillStore(sqlite: Database, exemplar: ReadonlyMap<string, Row[]>): Filled {
  const kept = triggerKeptTables(sqlite);
  const written = new Map<string, number>();
  const generic: string[] = [];
  for (const table of inDependencyOrder(sqlite, tablesOf(sqlite))) {
    if (kept.has(table)) continue;
    const columns = columnsOf(sqlite, table);
    const rows = exemplar.get(table) ?? [];
    if (rows.length === 0) {
      insert(sqlite, table, genericRow(sqlite, table, columns, 0));
      written.set(table, 1);
      generic.unshift(table);
      continue;
    }
    for (const [n, source] of rows.entries()) {
      const row: Row = {};
      for (const column of columns) {
        if (column.name in source) row[column.name] = source[column.name] as Value;
        else if (column.notnull === 1 && column.dflt_value === null)
          row[column.name] = typedValue(table, column, n);
      }
      insert(sqlite, table, row);
    }
    written.set(table, rows.length);
  }
  return { written, generic };
}

/**
 * Empties the tables that hold only generic rows: typed but not meaningful (an empty JSON object
 * where the app keeps a list), so the app's reads run over rows the app itself wrote.
 */
export function removeGenericRows(sqlite: Database, generic: readonly string[]): void {
  for (const table of generic) sqlite.run(`DELETE FROM ${quote(table)}`);
}

/** Every row of every table of the exemplar store. */
export function readAllRows(sqlite: Database): Map<string, Row[]> {
  return new Map(
    tablesOf(sqlite).map((table) => [table, sqlite.query<Row, []>(`SELECT * FROM ${quote(table)}`).all()]),
  );
}

export type Snapshot = Map<string, { columns: string[]; rows: string[] }>;

/** Every table's rows over all its columns, as `projectedRows`. */
export function snapshot(sqlite: Database): Snapshot {
  return new Map(
    tablesOf(sqlite).map((table) => {
      const columns = columnsOf(sqlite, table).map((c) => c.name);
      return [table, { columns, rows: projectedRows(sqlite, table, columns) }];
    }),
  );
}

/**
 * What changed since `before` in what it had: a table gone, or rows lost, added or changed in the
 * columns that still exist. `rewritten` (`table.column`) are left out: a migration meant to change them.
 */
export function changesSince(sqlite: Database, before: Snapshot, rewritten: ReadonlySet<string>): string[] {
  const tables = new Set(tablesOf(sqlite));
  const changes: string[] = [];
  for (const [table, old] of before) {
    if (!tables.has(table)) {
      changes.push(`${table}: the table is gone`);
      continue;
    }
    const current = new Set(columnsOf(sqlite, table).map((c) => c.name));
    const columns = old.columns.filter((name) => current.has(name) && !rewritten.has(`${table}.${name}`));
    const now = projectedRows(sqlite, table, columns);
    const then = old.rows
      .map((row) => {
        const values = JSON.parse(row) as unknown[];
        return JSON.stringify(columns.map((name) => values[old.columns.indexOf(name)]));
      })
      .sort();
    const lost = then.filter((row) => !now.includes(row));
    const added = now.filter((row) => !then.includes(row));
    if (now.length !== then.length || lost.length > 0 || added.length > 0) {
      changes.push(
        `${table} (${columns.join(", ")}): was ${lost.join(" ") || "-"}, now ${added.join(" ") || "-"}`,
      );
    }
  }
  return changes;
}

const plain = (value: Value): string | number | null =>
  value instanceof Uint8Array
    ? `x'${Buffer.from(value).toString("hex")}'`
    : typeof value === "bigint"
      ? `${value}n`
      : value;

/** A table's rows as sorted JSON over `columns`, so two snapshots compare as multisets. */
export function projectedRows(sqlite: Database, table: string, columns: string[]): string[] {
  return sqlite
    .query<Row, []>(`SELECT ${columns.map(quote).join(", ")} FROM ${quote(table)}`)
    .all()
    .map((row) => JSON.stringify(columns.map((name) => plain(row[name] as Value))))
    .sort();
}
