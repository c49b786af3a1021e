import type { Database } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { IdGenerator } from "../../src/domain/ids.ts";
import { silentLogger } from "../../src/http/logger.ts";
import { startSweeper } from "../../src/jobs/sweeper.ts";
import { LeaseRetention, type LeaseRetentionStep } from "../../src/modules/leases/retention.ts";
import { createServices } from "../../src/services.ts";
import { openStore } from "../../src/store/db.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";
import { activatedDevice, runtimeFixture } from "../support/runtime.ts";

/**
 * The month-start counts behind the usage report's past months (modules/leases/month-counts.ts)
 * are taken a chunk of the leases table per step: each equals the count the whole table gave,
 * across chunks, across a restart, and before any lease it counts is deleted.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
  t.clock.freeze();
});
afterEach(() => t.close());

const HOUR = 3_600_000;
const DAY = 24 * HOUR;
const month = (year: number, monthIndex: number) => Date.UTC(year, monthIndex, 1);
/** Where the tests stand: mid-March 2027, five month starts after the oldest lease's month. */
const NOW = Date.UTC(2027, 2, 10, 12);
const MONTH_STARTS = [
  month(2026, 9),
  month(2026, 10),
  month(2026, 11),
  month(2027, 0),
  month(2027, 1),
  month(2027, 2),
];

const moveClockTo = (ms: number) => t.clock.advance((ms - t.clock.now().getTime()) / 1000);

interface Planned {
  license: string;
  activation: string;
  created: number;
  expires: number;
  released: number | null;
}

/** A live and a test license, each with an activated device, to hang leases on. */
async function holders() {
  const live = await runtimeFixture(t);
  const test = await runtimeFixture(t, { key: t.keys.test });
  return {
    live: { license: live.licenseId, activation: (await activatedDevice(t, live)).activationId },
    test: { license: test.licenseId, activation: (await activatedDevice(t, test)).activationId },
  };
}

/**
 * Leases written straight into the table, ids in creation order as the service makes them: a
 * fixed pseudo-random spread over October 2026 to March 2027 (some across month starts, some
 * released), plus the edges of "held at T" (taken at T, expired at T, released at T).
 */
function insertLeases(owners: Awaited<ReturnType<typeof holders>>): string[] {
  let seed = 7;
  const random = () => {
    seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648;
    return seed / 2_147_483_648;
  };
  const planned: Planned[] = [];
  const from = Date.UTC(2026, 9, 5);
  for (let i = 0; i < 90; i++) {
    const owner = i % 3 === 0 ? owners.test : owners.live;
    const created = from + Math.floor(random() * (NOW - HOUR - from));
    const expires = created + Math.floor(random() * (i % 2 === 0 ? 40 * DAY : DAY));
    const released = random() < 0.4 ? created + Math.floor((expires - created) * random()) : null;
    planned.push({ ...owner, created, expires, released });
  }
  const dec = month(2026, 11);
  planned.push(
    { ...owners.live, created: dec, expires: dec + HOUR, released: null },
    { ...owners.live, created: dec - HOUR, expires: dec, released: null },
    { ...owners.test, created: dec - HOUR, expires: dec + HOUR, released: dec },
  );
  planned.sort((a, b) => a.created - b.created);
  const ids = new IdGenerator();
  const insert = t.deps.sqlite.prepare<
    unknown,
    [string, string, string, string, string, number, number, number | null]
  >(
    `INSERT INTO leases (id, license_id, activation_id, instance_id, status, created_at, expires_at, released_at)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
  );
  return planned.map((lease, i) => {
    const id = ids.next("lease", lease.created);
    const status = lease.released === null ? "active" : "released";
    insert.run(
      id,
      lease.license,
      lease.activation,
      `i-${i}`,
      status,
      lease.created,
      lease.expires,
      lease.released,
    );
    return id;
  });
}

/**
 * The count the whole table gives (the query the report ran before counts were stored): a lease
 * taken at the month start itself is the new month's, one released or expiring then is not held.
 */
const wholeTableCount = (sqlite: Database, environment: string, at: number) =>
  sqlite
    .query<{ n: number }, [string, number]>(
      `SELECT count(*) AS n FROM leases l JOIN licenses c ON c.id = l.license_id WHERE c.environment = ?1
       AND l.status IN ('active', 'released') AND l.expires_at > ?2
       AND l.created_at < ?2 AND (l.released_at IS NULL OR l.released_at > ?2)`,
    )
    .get(environment, at)?.n ?? 0;

const stored = () =>
  t.deps.sqlite
    .query<{ at: number; environment: string; active: number }, []>(
      "SELECT at, environment, active FROM lease_month_counts ORDER BY at, environment",
    )
    .all();

const expectedCounts = (ats: number[]) =>
  ats.flatMap((at) =>
    ["live", "test"].map((environment) => ({
      at,
      environment,
      active: wholeTableCount(t.deps.sqlite, environment, at),
    })),
  );

const progress = () =>
  t.deps.sqlite
    .query<{ at: number; after_id: string }, []>("SELECT at, after_id FROM lease_month_count_progress")
    .get();

/** Steps until the month starts are counted (the first step that is not counting). */
function countAll(retention: LeaseRetention): LeaseRetentionStep[] {
  const steps: LeaseRetentionStep[] = [];
  for (let i = 0; i < 10_000; i++) {
    const step = retention.step();
    if (step.counted === 0 && step.scanned === 0) return steps;
    steps.push(step);
  }
  throw new Error("the count never ends");
}

describe("counting in chunks", () => {
  test("each month start's stored count equals the whole table's, with leases spread across months and environments", async () => {
    insertLeases(await holders());
    // Taken before any step: the first step after the counts deletes leases.
    const expected = expectedCounts(MONTH_STARTS);
    moveClockTo(NOW);
    const steps = countAll(new LeaseRetention(t.deps, { countChunk: 4 }));
    expect(steps.filter((step) => step.counted === 1)).toHaveLength(MONTH_STARTS.length);
    expect(stored()).toEqual(expected);
    // Not all zero: the spread holds leases at every month start, in both environments.
    expect(stored().filter((row) => row.active > 0).length).toBeGreaterThan(MONTH_STARTS.length);
    expect(progress()).toBeNull();
  });

  test("a count interrupted between chunks resumes in a new process over the same store and gives the same counts", async () => {
    const ids = insertLeases(await holders());
    const expected = expectedCounts(MONTH_STARTS);
    moveClockTo(NOW);
    const first = new LeaseRetention(t.deps, { countChunk: 4 });
    // Into the second month start's count, part-way.
    for (let i = 0; i < Math.ceil(ids.length / 4) + 3; i++) first.step();
    expect(progress()?.at).toBe(MONTH_STARTS[1]);
    expect(progress()?.after_id).not.toBe("");
    const restarted = openStore(join(t.dir, "licensing.db"));
    try {
      const steps = countAll(
        new LeaseRetention({ sqlite: restarted.sqlite, clock: t.clock }, { countChunk: 4 }),
      );
      // It goes on from where the first stopped: the rest of this count, not the whole table again.
      expect(steps[0]?.counted).toBe(0);
      expect(steps.filter((step) => step.counted === 1)).toHaveLength(MONTH_STARTS.length - 1);
    } finally {
      restarted.close();
    }
    expect(stored()).toEqual(expected);
  });

  test("no counting step reads more than its chunk of leases", async () => {
    const ids = insertLeases(await holders());
    moveClockTo(NOW);
    const retention = new LeaseRetention(t.deps, { countChunk: 5 });
    const between = (after: string, through: string) =>
      ids.filter((id) => id > after && id <= through).length;
    let after = "";
    let steps = 0;
    for (let step = retention.step(); step.scanned > 0; step = retention.step()) {
      steps++;
      expect(step.scanned).toBeLessThanOrEqual(5);
      // The stored position moved by at most a chunk of the lease id index.
      const now = progress()?.after_id ?? ids.at(-1) ?? "";
      if (step.counted === 0) expect(between(after, now)).toBeLessThanOrEqual(5);
      after = step.counted === 1 ? "" : now;
    }
    expect(steps).toBe(MONTH_STARTS.length * Math.ceil(ids.length / 5));
  });

  test("each chunk seeks the lease id index where the last one stopped", async () => {
    const { sql } = await sqlPreparedDuring(t.deps.sqlite, () => new LeaseRetention(t.deps));
    const chunk = sql.find((text) => /^SELECT count\(\*\) AS n, max\(id\)/.test(text));
    const held = sql.find((text) => /^SELECT c\.environment/.test(text));
    expect(queryPlan(t.deps.sqlite, chunk as string)).toBe(
      "CO-ROUTINE (subquery-1) | SEARCH leases USING COVERING INDEX sqlite_autoindex_leases_1 (id>? AND id<?) | SCAN (subquery-1)",
    );
    expect(queryPlan(t.deps.sqlite, held as string)).toBe(
      "SEARCH l USING INDEX sqlite_autoindex_leases_1 (id>? AND id<?) | SEARCH c USING INDEX sqlite_autoindex_licenses_1 (id=?) | USE TEMP B-TREE FOR GROUP BY",
    );
  });

  test("no lease is deleted before every month start that has passed is counted", async () => {
    insertLeases(await holders());
    const expected = expectedCounts(MONTH_STARTS);
    moveClockTo(NOW);
    const before = t.deps.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM leases").get()?.n;
    const retention = new LeaseRetention(t.deps, { countChunk: 3, batch: 5 });
    let purged = 0;
    for (let step = retention.step(); ; step = retention.step()) {
      if (step.purged > 0) expect(stored()).toEqual(expected);
      if (step.scanned > 0) expect(purged).toBe(0);
      purged += step.purged;
      if (!step.more) break;
    }
    // Most of them were finished a week before NOW: the purge did run, after the counts.
    expect(purged).toBeGreaterThan(40);
    expect(t.deps.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM leases").get()?.n).toBe(
      (before ?? 0) - purged,
    );
  });

  test("starting the sweeper reads no lease before it returns, so a server listens before the first count", async () => {
    insertLeases(await holders());
    const expected = expectedCounts(MONTH_STARTS);
    moveClockTo(NOW);
    const services = createServices(t.deps, { baseUrl: BASE_URL });
    services.leaseRetention = new LeaseRetention(t.deps, { countChunk: 4 });
    const stop = startSweeper(services, silentLogger);
    try {
      expect(stored()).toEqual([]);
      expect(progress()).toBeNull();
      // Then, on later turns of the event loop, the pass counts a chunk at a time.
      for (let turn = 0; turn < 1_000 && stored().length < 2 * MONTH_STARTS.length; turn++)
        await new Promise<void>((resolve) => setImmediate(resolve));
      expect(stored()).toEqual(expected);
    } finally {
      stop();
    }
  });
});

describe("a clock that moves wrongly", () => {
  test("a month start is counted only once it is an hour past", async () => {
    insertLeases(await holders());
    const expected = expectedCounts(MONTH_STARTS);
    const march = month(2027, 2);
    moveClockTo(march + HOUR - 1);
    countAll(new LeaseRetention(t.deps));
    expect(stored().map((row) => row.at)).not.toContain(march);
    moveClockTo(march + HOUR);
    countAll(new LeaseRetention(t.deps));
    expect(stored()).toEqual(expected);
  });

  test("a count taken while the clock ran ahead is dropped when the clock is put back, and taken again once the month start has passed", async () => {
    const owners = await holders();
    insertLeases(owners);
    const expected = expectedCounts(MONTH_STARTS);
    const april = month(2027, 3);
    // The host's clock runs a day ahead: April 1st's count is taken before April really began.
    moveClockTo(april + DAY);
    countAll(new LeaseRetention(t.deps, { countChunk: 4 }));
    const early = stored().find((row) => row.at === april && row.environment === "live")?.active;
    expect(early).toBe(wholeTableCount(t.deps.sqlite, "live", april));
    // Put right, at March 31st: a lease is taken that is still held when April begins.
    moveClockTo(april - 2 * HOUR);
    const retention = new LeaseRetention(t.deps, { countChunk: 4 });
    retention.step();
    expect(stored().map((row) => row.at)).not.toContain(april);
    const ids = new IdGenerator();
    t.deps.sqlite
      .query(
        `INSERT INTO leases (id, license_id, activation_id, instance_id, status, created_at, expires_at, released_at)
         VALUES (?, ?, ?, 'late', 'active', ?, ?, NULL)`,
      )
      .run(
        ids.next("lease", april - HOUR),
        owners.live.license,
        owners.live.activation,
        april - HOUR,
        april + HOUR,
      );
    const expectedApril = expectedCounts([april]);
    moveClockTo(april + HOUR);
    countAll(retention);
    expect(stored()).toEqual([...expected, ...expectedApril]);
    expect(expectedApril.find((row) => row.environment === "live")?.active).toBe((early ?? 0) + 1);
  });

  test("a count in progress for a month start the clock has not reached is dropped too", async () => {
    insertLeases(await holders());
    const april = month(2027, 3);
    moveClockTo(april + DAY);
    const retention = new LeaseRetention(t.deps, { countChunk: 4 });
    for (let i = 0; i < 1_000 && progress()?.at !== april; i++) retention.step();
    expect(progress()?.at).toBe(april);
    moveClockTo(april - 2 * HOUR);
    retention.step();
    expect(progress()).toBeNull();
    expect(stored().map((row) => row.at)).not.toContain(april);
  });
});
