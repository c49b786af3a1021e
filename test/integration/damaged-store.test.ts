import { Database } from "bun:sqlite";
import { afterAll, beforeAll, expect, test } from "bun:test";
import { closeSync, openSync, writeSync } from "node:fs";
import { join } from "node:path";
import { createApp } from "../../src/app.ts";
import type { Logger } from "../../src/http/logger.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";

/**
 * A store file damaged on disk (a bad sector, a copy taken mid-write): the root page of the
 * customers table overwritten with garbage, as SQLite finds it on its next read. Requests that
 * reach the page fail with a 500 in the envelope and a log line that says what it is and what to
 * do; everything else keeps being served.
 */
let t: TestContext;
const logged: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
const logger: Logger = { log: (level, msg, fields) => logged.push({ level, msg, fields }) };

beforeAll(async () => {
  t = createTestContext();
  // Enough rows that the table's root is an interior page every lookup passes through.
  for (let i = 0; i < 200; i++) {
    const created = await t.call("POST", "/mgmt/v1/customers", {
      body: { name: `Customer ${i}`, notes: "n".repeat(400) },
      headers: t.idem(),
    });
    expect(created.status).toBe(201);
  }
  t.deps.sqlite.run("PRAGMA wal_checkpoint(TRUNCATE)");
  const { page_size: pageSize } = t.deps.sqlite.query("PRAGMA page_size").get() as { page_size: number };
  const { rootpage } = t.deps.sqlite
    .query("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = 'customers'")
    .get() as { rootpage: number };
  const fd = openSync(join(t.dir, "licensing.db"), "r+");
  writeSync(fd, Buffer.alloc(pageSize, 0xa5), 0, pageSize, (rootpage - 1) * pageSize);
  closeSync(fd);
  // Another connection's write moves the WAL on, so the server's connection drops its cached
  // pages at its next read and meets the damaged one, as after a restart.
  const other = new Database(join(t.dir, "licensing.db"));
  other.run("CREATE TABLE moved_on (x INTEGER)");
  other.close();
});
afterAll(() => t.close());

test("a request that reaches a damaged page answers 500 in the envelope and logs 'store damaged' with what to do; other routes keep working", async () => {
  const app = createApp(t.deps, { baseUrl: BASE_URL, logger });
  const get = (path: string) =>
    app.handle(new Request(`${BASE_URL}${path}`, { headers: { authorization: `Bearer ${t.keys.live}` } }));

  const damaged = await get("/mgmt/v1/customers");
  const body = (await damaged.json()) as { error: { code: string; request_id: string } };
  expect([damaged.status, body.error.code]).toEqual([500, "INTERNAL_ERROR"]);
  const lines = logged.filter((line) => line.level === "error");
  expect(lines.map((line) => line.msg)).toEqual(["store damaged"]);
  expect(lines[0]?.fields).toMatchObject({ request_id: body.error.request_id });
  expect(String(lines[0]?.fields?.error)).toMatch(/malformed|not a database/);
  expect(String(lines[0]?.fields?.advice)).toContain("restore the last good backup");

  expect((await get("/mgmt/v1/products")).status).toBe(200);
});
