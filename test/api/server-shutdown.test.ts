import { Database } from "bun:sqlite";
import { afterEach, beforeEach, expect, test } from "bun:test";
import { join } from "node:path";
import { resolveConfig } from "../../src/config.ts";
import type { Logger, LogLevel } from "../../src/http/logger.ts";
import { startServer } from "../../src/server.ts";
import { createTestContext, serveTestStore, type TestContext } from "../support/harness.ts";

/**
 * The server's shutdown (server.ts) through a real server on a free port. The last step that
 * writes, the usage counts gathered since the last flush, can fail; the store must still close and
 * the data directory's serve lock must still be let go, or the next `licensing serve` is refused.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

test("a usage flush that fails at shutdown is logged, and the store closes and the directory can be served again", async () => {
  const logged: { level: LogLevel; msg: string; fields?: Record<string, unknown> }[] = [];
  const logger: Logger = { log: (level, msg, fields) => logged.push({ level, msg, fields }) };
  const server = startServer({
    config: { ...resolveConfig({ "data-dir": t.dir }, {}, t.dir), port: 0 },
    passphrase: "test passphrase",
    logger,
  });
  // Counted in memory toward the month's allowance, to be written at the next flush.
  const listed = await fetch(`${server.url}/mgmt/v1/products`, {
    headers: { authorization: `Bearer ${t.keys.live}` },
  });
  expect(listed.status).toBe(200);

  // Another process's long write (a command holding the write lock past the busy timeout).
  const other = new Database(join(t.dir, "licensing.db"));
  other.run("BEGIN IMMEDIATE");
  try {
    await server.shutdown("test");
  } finally {
    other.run("ROLLBACK");
    other.close();
  }
  await server.closed;
  const failure = logged.find((line) => line.msg === "shutdown: usage not recorded");
  expect(failure?.level).toBe("error");
  expect(String(failure?.fields?.error)).toContain("locked");
  expect(logged.at(-1)?.msg).toBe("stopped");

  // The serve lock was let go: a new server starts on the same directory.
  const next = serveTestStore(t);
  await next.shutdown("test done");
  // The flush waits out the store's 5 s busy timeout before it fails.
}, 20_000);
