import { Database } from "bun:sqlite";
import { beforeEach, describe, expect, test } from "bun:test";
import { AdjustableClock } from "../../src/domain/clock.ts";
import { nextMonthStart } from "../../src/domain/months.ts";
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
