import { Database } from "bun:sqlite";
import { expect, test } from "bun:test";
import { eq } from "drizzle-orm";
import { drizzle } from "drizzle-orm/bun-sqlite";
import { integer, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { preparedInsert } from "../../src/store/prepared-insert.ts";
import { preparedRowReader } from "../../src/store/prepared-select.ts";
import { timestamp } from "../../src/store/schema/columns.ts";

const things = sqliteTable("things", {
  id: text("id").primaryKey(),
  kind: text("kind", { enum: ["a", "b"] }).notNull(),
  details: text("details", { mode: "json" }).$type<Record<string, unknown>>().notNull(),
  seenAt: timestamp("seen_at").notNull(),
  endedAt: timestamp("ended_at"),
  enabled: integer("enabled", { mode: "boolean" }).notNull(),
  note: text("note"),
  count: integer("count").notNull(),
});

function freshDb() {
  const sqlite = new Database(":memory:", { strict: true });
  sqlite.run(
    `CREATE TABLE things (id TEXT PRIMARY KEY, kind TEXT NOT NULL, details TEXT NOT NULL, seen_at INTEGER NOT NULL,
     ended_at INTEGER, enabled INTEGER NOT NULL, note TEXT, count INTEGER NOT NULL)`,
  );
  return { sqlite, db: drizzle({ client: sqlite }) };
}

const raw = (sqlite: Database, id: string) => {
  const row = sqlite.query<Record<string, unknown>, [string]>("SELECT * FROM things WHERE id = ?").get(id);
  const { id: _id, ...rest } = row ?? {};
  return rest;
};

test("a prepared insert stores exactly what Drizzle's insert stores, column by column", () => {
  const { sqlite, db } = freshDb();
  const insert = preparedInsert(sqlite, things);
  const rows = [
    {
      kind: "a" as const,
      details: { os: "linux", nested: { n: 1, list: [true, null, "ü"] } },
      seenAt: new Date(1_700_000_000_123),
      endedAt: null,
      enabled: true,
      note: null,
      count: 0,
    },
    {
      kind: "b" as const,
      details: {},
      seenAt: new Date(0),
      endedAt: new Date(1_800_000_000_999),
      enabled: false,
      note: "a 'quoted' note",
      count: 2 ** 40,
    },
  ];
  rows.forEach((row, i) => {
    db.insert(things)
      .values({ id: `drizzle-${i}`, ...row })
      .run();
    insert({ id: `prepared-${i}`, ...row });
    expect(raw(sqlite, `prepared-${i}`)).toEqual(raw(sqlite, `drizzle-${i}`));
    // And Drizzle reads it back as the same values.
    expect(
      db
        .select()
        .from(things)
        .all()
        .find((r) => r.id === `prepared-${i}`),
    ).toEqual({ id: `prepared-${i}`, ...row });
  });
});

test("an omitted optional column is stored as NULL, and a constraint still holds", () => {
  const { sqlite } = freshDb();
  const insert = preparedInsert(sqlite, things);
  insert({ id: "x", kind: "a", details: {}, seenAt: new Date(5), enabled: true, count: 1 });
  expect(raw(sqlite, "x")).toMatchObject({ ended_at: null, note: null });
  expect(() =>
    insert({ id: "x", kind: "a", details: {}, seenAt: new Date(5), enabled: true, count: 1 }),
  ).toThrow("UNIQUE constraint failed");
});

test("a prepared row reader returns the same object as Drizzle's select, nulls and all", () => {
  const { sqlite, db } = freshDb();
  const insert = preparedInsert(sqlite, things);
  insert({
    id: "full",
    kind: "b",
    details: { a: [1, { b: null }] },
    seenAt: new Date(7),
    endedAt: new Date(8),
    enabled: false,
    note: "n",
    count: 3,
  });
  insert({ id: "sparse", kind: "a", details: {}, seenAt: new Date(9), enabled: true, count: 0 });
  const read = preparedRowReader<typeof things, [string]>(sqlite, things, '"id" = ?');
  for (const id of ["full", "sparse"]) {
    expect(read(id)).toEqual(db.select().from(things).where(eq(things.id, id)).get());
  }
  expect(read("missing")).toBeUndefined();
});
