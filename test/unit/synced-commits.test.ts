import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openStore, type Store, withSyncedCommits } from "../../src/store/db.ts";

let dir: string;
let store: Store;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "licensing-synced-"));
  store = openStore(join(dir, "licensing.db"));
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

const synchronous = () =>
  store.sqlite.query<{ synchronous: number }, []>("PRAGMA synchronous").get()?.synchronous;

// 1 = NORMAL (the store's setting: a WAL commit is not fsynced), 2 = FULL (it is).
test("work inside runs with commits synced to disk, and the store's setting comes back after", () => {
  expect(synchronous()).toBe(1);
  const inside = withSyncedCommits(store.sqlite, () => {
    store.sqlite.run("CREATE TABLE t (x INTEGER)");
    return synchronous();
  });
  expect(inside).toBe(2);
  expect(synchronous()).toBe(1);
});

test("the setting comes back when the work throws", () => {
  expect(() =>
    withSyncedCommits(store.sqlite, () => {
      throw new Error("refused");
    }),
  ).toThrow("refused");
  expect(synchronous()).toBe(1);
});
