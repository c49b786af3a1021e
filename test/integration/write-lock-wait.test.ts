import { afterEach, beforeEach, expect, test } from "bun:test";
import { join } from "node:path";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * Another process holding the store's write lock for a moment (the command line: even a
 * read-only command takes it briefly) must make the server's writes wait, not fail. The lock is
 * held by a real second process, because the wait is SQLite's busy handler, which blocks the
 * thread that asks: a holder in this process could never let go.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const HOLD_MS = 300;

/** A child that takes the write lock, says so on stdout, holds it HOLD_MS, then commits. */
async function holdWriteLock(path: string) {
  const child = Bun.spawn(
    [
      process.execPath,
      "-e",
      `import { Database } from "bun:sqlite";
       const db = new Database(${JSON.stringify(path)});
       db.run("PRAGMA busy_timeout = 5000");
       db.run("BEGIN IMMEDIATE");
       console.log("locked");
       await Bun.sleep(${HOLD_MS});
       db.run("COMMIT");
       db.close();`,
    ],
    { stdout: "pipe", stderr: "inherit" },
  );
  const reader = child.stdout.getReader();
  const { value } = await reader.read();
  expect(new TextDecoder().decode(value)).toContain("locked");
  return child;
}

test("a management write that reads before it writes waits out another process's write lock instead of answering 503", async () => {
  const created = await t.call("POST", "/mgmt/v1/customers", { body: { name: "Ada" }, headers: t.idem() });
  expect(created.status).toBe(201);
  const id = created.body.data.public_id;
  const child = await holdWriteLock(join(t.dir, "licensing.db"));
  // The update reads the customer (and its version) first, then writes.
  const updated = await t.call("PATCH", `/mgmt/v1/customers/${id}`, { body: { name: "Ada Lovelace" } });
  expect(await child.exited).toBe(0);
  expect(updated.status).toBe(200);
  expect(updated.body.data.name).toBe("Ada Lovelace");
});
