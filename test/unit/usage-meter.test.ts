import { Database } from "bun:sqlite";
import { beforeEach, describe, expect, test } from "bun:test";
import { AdjustableClock } from "../../src/domain/clock.ts";
import { nextMonthStart } from "../../src/domain/months.ts";
import type { Logger } from "../../src/http/logger.ts";
import { flushPendingUsage } from "../../src/jobs/usage-flush.ts";
import { monthOf, UsageMeter } from "../../src/modules/plan/usage-meter.ts";
import { migrate } from "../../src/store/migrate.ts";

let sqlite: Database;
let clock: AdjustableClock;
beforeEach(() => {
  sqlite = new Database(":memory:");
  migrate(sqlite);
  clock = new AdjustableClock();
});

const stored = (metric: string) =>
  sqlite
    .query<{ n: number }, [string]>(
      "SELECT coalesce(sum(count), 0) AS n FROM usage_counters WHERE metric = ?",
    )
    .get(metric)?.n;

test("counts are held in memory, flushed in batches, and survive a new meter over the same store", () => {
  const meter = new UsageMeter(sqlite, clock);
  meter.flush();
  for (let i = 0; i < 3; i++) meter.count("m");
  expect(meter.used("m")).toBe(3);
  expect(stored("m")).toBe(0);
  meter.flush();
  expect(new UsageMeter(sqlite, clock).used("m")).toBe(3);
});

test("a hundred counts flush on their own", () => {
  const meter = new UsageMeter(sqlite, clock);
  meter.flush();
  for (let i = 0; i < 100; i++) meter.count("m");
  expect(stored("m")).toBe(100);
});

test("each calendar month counts from zero", () => {
  const meter = new UsageMeter(sqlite, clock);
  meter.count("m");
  clock.advance((nextMonthStart(clock.now()).getTime() - clock.now().getTime()) / 1000 + 1);
  expect(meter.used("m")).toBe(0);
});

/** Writes of the metric "b" fail (as a full disk or a refused COMMIT would) until `restore` is called. */
function failWritesOfB(): { restore(): void } {
  for (const event of ["INSERT", "UPDATE"]) {
    sqlite.run(
      `CREATE TEMP TRIGGER fail_${event} BEFORE ${event} ON usage_counters
       WHEN NEW.metric = 'b' BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END`,
    );
  }
  return {
    restore() {
      sqlite.run("DROP TRIGGER fail_INSERT");
      sqlite.run("DROP TRIGGER fail_UPDATE");
    },
  };
}

describe("a flush that fails", () => {
  test("changes nothing in memory: after a successful retry every figure is exactly what was counted", () => {
    const meter = new UsageMeter(sqlite, clock);
    meter.flush();
    meter.count("a");
    meter.count("b");
    // "a" is written first in the transaction, then "b" fails and the whole transaction goes.
    const failing = failWritesOfB();
    expect(() => meter.flush()).toThrow("disk I/O error");
    expect(stored("a")).toBe(0);
    expect(meter.used("a")).toBe(1);
    expect(meter.used("b")).toBe(1);
    expect(meter.pendingCount).toBe(2);
    failing.restore();
    meter.flush();
    expect(meter.used("a")).toBe(1);
    expect(meter.used("b")).toBe(1);
    expect(stored("a")).toBe(1);
    expect(stored("b")).toBe(1);
    expect(new UsageMeter(sqlite, clock).used("a")).toBe(1);
  });

  test("a count whose batch cannot be written still counts, and never throws at the call it counts", () => {
    const meter = new UsageMeter(sqlite, clock);
    meter.flush();
    meter.count("b");
    const failing = failWritesOfB();
    let writes = 0;
    const write = sqlite.transaction.bind(sqlite);
    sqlite.transaction = ((fn: () => void) => {
      writes++;
      return write(fn);
    }) as typeof sqlite.transaction;
    for (let i = 1; i < 150; i++) meter.count("b");
    expect(meter.pendingCount).toBe(150);
    expect(meter.used("b")).toBe(150);
    // One try at the hundredth count; the rest wait for the timer rather than each trying again.
    expect(writes).toBe(1);
    failing.restore();
    meter.flush();
    meter.count("b");
    expect([stored("b"), meter.pendingCount, meter.used("b")]).toEqual([150, 1, 151]);
  });

  test("failing again and again never inflates the figure that quotas are checked against", () => {
    const meter = new UsageMeter(sqlite, clock);
    meter.flush();
    meter.count("a");
    meter.count("b");
    const failing = failWritesOfB();
    for (let i = 0; i < 3; i++) {
      expect(() => meter.flush()).toThrow("disk I/O error");
      meter.count("a");
    }
    failing.restore();
    meter.flush();
    expect(meter.used("a")).toBe(4);
    expect(stored("a")).toBe(4);
  });
});

describe("the flusher's tick", () => {
  const logged: string[] = [];
  const logger: Logger = { log: (level, msg) => logged.push(`${level} ${msg}`) };
  beforeEach(() => {
    logged.length = 0;
  });

  test("writes counts that no later count would have written", () => {
    const meter = new UsageMeter(sqlite, clock);
    meter.count("m");
    meter.count("m");
    // Within 5 seconds of the meter's start: both wait, and no request follows.
    expect(stored("m")).toBe(0);
    flushPendingUsage(meter, logger);
    expect(stored("m")).toBe(2);
    expect(meter.pendingCount).toBe(0);
  });

  test("a failing write is logged and the counts stay for the next tick", () => {
    const meter = new UsageMeter(sqlite, clock);
    meter.flush();
    meter.count("b");
    const failing = failWritesOfB();
    flushPendingUsage(meter, logger);
    expect(logged).toEqual(["error usage counts not recorded"]);
    expect(meter.pendingCount).toBe(1);
    failing.restore();
    flushPendingUsage(meter, logger);
    expect(stored("b")).toBe(1);
    expect(meter.used("b")).toBe(1);
  });
});

describe("monthOf", () => {
  test("names the UTC month of any instant, whatever month was asked for before", () => {
    const instants = [
      "2026-11-22T23:59:59.999Z",
      "2026-12-01T00:00:00.000Z",
      "2026-11-30T23:59:59.999Z",
      "2027-01-01T00:00:00.000Z",
      "2024-02-29T12:00:00.000Z",
      "2026-11-01T00:00:00.000Z",
      "2026-10-31T23:59:59.999Z",
    ];
    for (const instant of instants) expect(monthOf(new Date(instant))).toBe(instant.slice(0, 7));
  });
});
