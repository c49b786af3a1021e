import { Database } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GroupCommit } from "../../src/store/group-commit.ts";

let dir: string;
let writer: Database;
let reader: Database;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "group-commit-"));
  const path = join(dir, "store.db");
  writer = new Database(path, { create: true, strict: true });
  writer.run("PRAGMA journal_mode = WAL");
  writer.run("PRAGMA foreign_keys = ON");
  writer.run("CREATE TABLE parents (id INTEGER PRIMARY KEY)");
  // Checked at COMMIT: a way to make one batch's commit fail.
  writer.run(
    "CREATE TABLE rows (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
  );
  writer.run("INSERT INTO parents (id) VALUES (1)");
  reader = new Database(path, { readonly: true });
});

afterEach(() => {
  reader.close();
  writer.close();
  rmSync(dir, { recursive: true, force: true });
});

const insert =
  (id: number, parent = 1) =>
  () => {
    writer.run("INSERT INTO rows (id, parent) VALUES (?, ?)", [id, parent]);
    return id;
  };
const committedIds = () =>
  reader
    .query<{ id: number }, []>("SELECT id FROM rows ORDER BY id")
    .all()
    .map((r) => r.id);

describe("group commit", () => {
  test("a call settles only once its writes are visible to another connection", async () => {
    const commits = new GroupCommit(writer);
    const seenAtSettle: number[][] = [];
    const calls = [1, 2, 3].map((id) =>
      commits.run(insert(id)).then(() => seenAtSettle.push(committedIds())),
    );
    // Nothing has run yet: the batch waits for the end of this turn.
    expect(committedIds()).toEqual([]);
    await Promise.all(calls);
    expect(seenAtSettle).toEqual([
      [1, 2, 3],
      [1, 2, 3],
      [1, 2, 3],
    ]);
  });

  test("the calls of one turn share one commit: when it fails, every call fails and nothing is kept", async () => {
    const commits = new GroupCommit(writer);
    const results = await Promise.allSettled([
      commits.run(insert(1)),
      commits.run(insert(2, 99)), // no parent 99: refused at COMMIT, not at the insert
      commits.run(insert(3)),
    ]);
    expect(results.map((r) => r.status)).toEqual(["rejected", "rejected", "rejected"]);
    expect(String((results[0] as PromiseRejectedResult).reason)).toContain("FOREIGN KEY");
    expect(committedIds()).toEqual([]);
    expect(writer.inTransaction).toBe(false);
    // The connection is usable afterwards.
    expect(await commits.run(insert(4))).toBe(4);
    expect(committedIds()).toEqual([4]);
  });

  test("a call that throws has its own writes undone and its error delivered; the others commit", async () => {
    const commits = new GroupCommit(writer);
    const failing = () => {
      writer.run("INSERT INTO rows (id, parent) VALUES (20, 1)");
      throw new Error("refused after writing");
    };
    const results = await Promise.allSettled([
      commits.run(insert(10)),
      commits.run(failing),
      commits.run(insert(30)),
    ]);
    expect(results[0]).toEqual({ status: "fulfilled", value: 10 });
    expect((results[1] as PromiseRejectedResult).reason).toEqual(new Error("refused after writing"));
    expect(results[2]).toEqual({ status: "fulfilled", value: 30 });
    expect(committedIds()).toEqual([10, 30]);
  });

  test("a call that throws makes the batch run again with each call isolated, and each write is kept once", async () => {
    const commits = new GroupCommit(writer);
    const runs = { first: 0, failing: 0, last: 0 };
    const counted = (name: keyof typeof runs, id: number) => () => {
      runs[name]++;
      return insert(id)();
    };
    const results = await Promise.allSettled([
      commits.run(counted("first", 1)),
      commits.run(() => {
        runs.failing++;
        throw new Error("a bug");
      }),
      commits.run(counted("last", 3)),
    ]);
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "rejected", "fulfilled"]);
    // The first try stopped at the failing call; the second ran all three.
    expect(runs).toEqual({ first: 2, failing: 2, last: 1 });
    expect(committedIds()).toEqual([1, 3]);
  });

  test("a nested transaction inside a call works as a savepoint of the batch", async () => {
    const commits = new GroupCommit(writer);
    const nested = writer.transaction(() => {
      writer.run("INSERT INTO rows (id, parent) VALUES (5, 1)");
      throw new Error("inner");
    });
    const value = await commits.run(() => {
      writer.run("INSERT INTO rows (id, parent) VALUES (6, 1)");
      try {
        nested.immediate();
      } catch {
        // The inner work is undone; the call goes on.
      }
      return "done";
    });
    expect(value).toBe("done");
    expect(committedIds()).toEqual([6]);
  });

  test("beyond the batch size the calls go into further commits, each on its own", async () => {
    const commits = new GroupCommit(writer, 2);
    const results = await Promise.allSettled([
      commits.run(insert(1)),
      commits.run(insert(2)),
      commits.run(insert(3, 99)),
      commits.run(insert(4)),
    ]);
    // The first commit (1, 2) stands; the second (3, 4) failed as a whole.
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "fulfilled", "rejected", "rejected"]);
    expect(committedIds()).toEqual([1, 2]);
  });

  test("a batch stops taking calls once its work has run past the budget; the rest commit next, in order", async () => {
    // The budget's clock moves only when a call says so: a machine that pauses this process
    // mid-call cannot change how the calls are batched.
    let ms = 0;
    const commits = new GroupCommit(writer, 64, 5, () => ms);
    const slowInsert = (id: number) => () => {
      ms += 3; // Two such calls use up the 5 ms budget.
      return insert(id)();
    };
    const seenAtSettle = new Map<number, number[]>();
    await Promise.all(
      [1, 2, 3, 4, 5].map((id) =>
        commits.run(slowInsert(id)).then(() => seenAtSettle.set(id, committedIds())),
      ),
    );
    // Each batch ran until 5 ms had passed: two calls, two calls, then the last one.
    expect([...seenAtSettle.entries()].sort((a, b) => a[0] - b[0])).toEqual([
      [1, [1, 2]],
      [2, [1, 2]],
      [3, [1, 2, 3, 4]],
      [4, [1, 2, 3, 4]],
      [5, [1, 2, 3, 4, 5]],
    ]);
  });

  test("a call that throws in a batch the budget cut short is retried with the calls before it only", async () => {
    let ms = 0;
    const commits = new GroupCommit(writer, 64, 2, () => ms);
    const runs = { first: 0, failing: 0, last: 0 };
    let seenByFirst: number[] = [];
    const results = await Promise.allSettled([
      commits
        .run(() => {
          runs.first++;
          return insert(1)();
        })
        .then(() => {
          seenByFirst = committedIds();
        }),
      commits.run(() => {
        runs.failing++;
        ms += 3; // Past the budget: the batch takes no call after this one.
        throw new Error("a bug");
      }),
      commits.run(() => {
        runs.last++;
        return insert(3)();
      }),
    ]);
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "rejected", "fulfilled"]);
    expect(runs).toEqual({ first: 2, failing: 2, last: 1 });
    // The retried batch was the first two calls; the last one committed after it, on its own.
    expect(seenByFirst).toEqual([1]);
    expect(committedIds()).toEqual([1, 3]);
  });

  test("held calls wait without blocking the event loop and run on release", async () => {
    const commits = new GroupCommit(writer);
    commits.hold();
    let settled = false;
    const call = commits.run(insert(7)).then(() => {
      settled = true;
    });
    await Bun.sleep(20);
    expect(settled).toBe(false);
    expect(commits.waiting).toBe(1);
    expect(committedIds()).toEqual([]);
    commits.release();
    await call;
    expect(committedIds()).toEqual([7]);
  });

  test("a transaction left open on the connection fails the batch instead of swallowing its commit", async () => {
    const commits = new GroupCommit(writer);
    writer.run("BEGIN");
    await expect(commits.run(insert(8))).rejects.toThrow("already in a transaction");
    writer.run("ROLLBACK");
    expect(committedIds()).toEqual([]);
  });
});
