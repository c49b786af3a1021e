import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { silentLogger } from "../../src/http/logger.ts";
import { startSweeper, sweepLeases } from "../../src/jobs/sweeper.ts";
import { LEASE_RETENTION_DAYS, LeaseRetention } from "../../src/modules/leases/retention.ts";
import { announceExpiries } from "../../src/modules/webhooks/expiries.ts";
import { WebhookService } from "../../src/modules/webhooks/service.ts";
import { createServices } from "../../src/services.ts";
import { expectSignedEnvelope } from "../support/envelope.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";
import { activatedDevice, proofCall, runtimeFixture } from "../support/runtime.ts";

/**
 * Finished leases are deleted after their retention (modules/leases/retention.ts), and nothing
 * that reads old lease rows answers differently for it: the seat count and its trigger-kept
 * counter, the usage report's past months, and the lease.expired announcements.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
  // Held still: leases are taken, and reports read, at exact moments around a month start.
  t.clock.freeze();
});
afterEach(() => t.close());

const DAY = 86_400;
const RETENTION = LEASE_RETENTION_DAYS * DAY;
const TTL = 600;
/**
 * The start of a month at least an hour ahead of `now`: the tests move the clock to just before it,
 * which a run starting in a month's last minutes could not do with the very next month start.
 */
const monthStartAnHourAway = (now: Date): number => {
  const later = new Date(now.getTime() + 3_600_000);
  return Date.UTC(later.getUTCFullYear(), later.getUTCMonth() + 1, 1);
};

/** The start of the month before the one that starts at `monthStart`. */
const monthBefore = (monthStart: number): number => {
  const d = new Date(monthStart);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() - 1, 1);
};

const leaseIds = () =>
  t.deps.sqlite
    .query<{ id: string }, []>("SELECT id FROM leases ORDER BY id")
    .all()
    .map((row) => row.id);

/** The trigger-kept counter next to what it counts: leases marked active, expired or not. */
const counters = () =>
  t.deps.sqlite
    .query<{ kept: number; actual: number }, []>(
      `SELECT (SELECT coalesce(sum(active), 0) FROM lease_counts) AS kept,
              (SELECT count(*) FROM leases WHERE status = 'active') AS actual`,
    )
    .get();

const sweep = () => sweepLeases(createServices(t.deps, { baseUrl: BASE_URL }), silentLogger);

/** A device on a floating license that takes, renews and releases leases by instance name. */
async function seats(policy: Record<string, unknown> = {}) {
  const fx = await runtimeFixture(t, {
    policy: {
      max_machines: 10,
      max_concurrent: 100,
      concurrency_unit: "instance",
      lease_ttl_sec: TTL,
      lease_heartbeat_sec: 120,
      ...policy,
    },
  });
  const d = await activatedDevice(t, fx);
  const leaseOf = new Map<string, string>();
  const acquire = (instance: string) =>
    proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, {
      activation_id: d.activationId,
      instance_id: instance,
    });
  const take = async (instance: string): Promise<string> => {
    const response = await acquire(instance);
    expect(response.status).toBe(201);
    leaseOf.set(instance, response.body.data.lease_id);
    return response.body.data.lease_id as string;
  };
  const renew = (instance: string) =>
    proofCall(t, d.device, "POST", `/runtime/v1/leases/${leaseOf.get(instance)}/heartbeat`, d.activationId, {
      instance_id: instance,
    });
  const release = (instance: string) =>
    proofCall(t, d.device, "DELETE", `/runtime/v1/leases/${leaseOf.get(instance)}`, d.activationId, {
      instance_id: instance,
    });
  const deactivate = () =>
    proofCall(t, d.device, "DELETE", `/runtime/v1/activations/${d.activationId}`, d.activationId);
  return { acquire, take, renew, release, deactivate, fx, activationId: d.activationId };
}

describe("which leases go", () => {
  test("a sweep deletes leases released or expired more than the retention ago and keeps younger finished ones and live ones", async () => {
    const old = await seats();
    const released = await old.take("released");
    expect((await old.release("released")).status).toBe(200);
    const expired = await old.take("expired");
    // Taken as long ago, but kept alive all along: a 7-day lease renewed before it lapses.
    const long = await seats({ lease_ttl_sec: 7 * DAY, lease_heartbeat_sec: DAY });
    const held = await long.take("held");
    t.clock.advance(6 * DAY);
    expect((await long.renew("held")).status).toBe(200);
    t.clock.advance(RETENTION - 6 * DAY + TTL + 1);
    const young = await seats();
    const recentlyReleased = await young.take("recent");
    expect((await young.release("recent")).status).toBe(200);
    const live = await young.take("live");
    t.clock.advance(1);

    expect(await sweep()).toBe(2);
    expect(leaseIds()).not.toContain(released);
    expect(leaseIds()).not.toContain(expired);
    expect(leaseIds().sort()).toEqual([held, recentlyReleased, live].sort());
    // The live ones still answer as before.
    expect((await long.renew("held")).status).toBe(200);
    expect((await young.renew("live")).status).toBe(200);
  });

  test("a lease released before its expiry stays until the expiry, too, is a retention past", async () => {
    const s = await seats();
    const lease = await s.take("a");
    expect((await s.release("a")).status).toBe(200);
    // Released at once, expiring TTL later: a retention after the release it is not gone yet.
    t.clock.advance(RETENTION + 1);
    expect(await sweep()).toBe(0);
    expect(leaseIds()).toEqual([lease]);
    t.clock.advance(TTL);
    expect(await sweep()).toBe(1);
    expect(leaseIds()).toEqual([]);
  });

  test("renewing or releasing a deleted lease answers 404 NOT_FOUND, as for a lease that never existed", async () => {
    const s = await seats();
    await s.take("gone");
    t.clock.advance(RETENTION + TTL + 1);
    expect((await s.renew("gone")).body.error.code).toBe("LEASE_EXPIRED");
    expect(await sweep()).toBe(1);
    const renewed = await s.renew("gone");
    expect(renewed.status).toBe(404);
    expect(renewed.body.error.code).toBe("NOT_FOUND");
    const released = await s.release("gone");
    expect(released.status).toBe(404);
    expect(released.body.error.code).toBe("NOT_FOUND");
    // The device takes a new lease, as after 410 or 422.
    expect((await s.acquire("gone")).status).toBe(201);
  });

  test("after the retention week, renewing a lease of a deactivated device answers 404, and the acquire that follows answers the signed 410 ACTIVATION_DEACTIVATED", async () => {
    const s = await seats();
    await s.take("a");
    expect((await s.deactivate()).status).toBe(200);
    // Within the week the lease is there, and license and device state come before its own.
    const within = await s.renew("a");
    expect(within.status).toBe(410);
    expect(within.body.error.code).toBe("ACTIVATION_DEACTIVATED");
    t.clock.advance(RETENTION + TTL + 1);
    expect(await sweep()).toBe(1);
    // The lease's existence is checked first (protocol §11): a deleted lease is 404, unsigned.
    const renewed = await s.renew("a");
    expect(renewed.status).toBe(404);
    expect(renewed.body.error.code).toBe("NOT_FOUND");
    expect(renewed.body.response_signature).toBeUndefined();
    // The device acquires again, as 404 tells it to, and learns the deactivation, signed.
    const acquired = await s.acquire("a");
    expect(acquired.status).toBe(410);
    expect(acquired.body.error).toMatchObject({
      code: "ACTIVATION_DEACTIVATED",
      details: { activation_id: s.activationId },
    });
    expectSignedEnvelope(acquired.body, {
      status: 410,
      nonce: acquired.body.response_assertion.nonce,
      productId: s.fx.productId,
      bundle: s.fx.bundle,
    });
  });
});

describe("seat counting after a purge", () => {
  test("the trigger-kept counter follows the deletes, a license at its limit still refuses and one below still grants", async () => {
    const s = await seats({ max_concurrent: 2 });
    await s.take("lapsed-1");
    await s.take("lapsed-2");
    t.clock.advance(RETENTION + TTL + 1);
    // Two expired leases still marked active: the counter says 2 before the purge.
    expect(counters()).toEqual({ kept: 2, actual: 2 });
    await s.take("live-1");
    await s.take("live-2");
    expect(counters()).toEqual({ kept: 4, actual: 4 });

    expect(await sweep()).toBe(2);
    expect(counters()).toEqual({ kept: 2, actual: 2 });
    const refused = await s.acquire("third");
    expect(refused.status).toBe(409);
    expect(refused.body.error.code).toBe("CONCURRENCY_LIMIT_REACHED");
    expect((await s.release("live-1")).status).toBe(200);
    expect(counters()).toEqual({ kept: 1, actual: 1 });
    expect((await s.acquire("third")).status).toBe(201);
    expect(counters()).toEqual({ kept: 2, actual: 2 });
  });
});

describe("the usage report", () => {
  const report = async (period: string) => {
    const response = await t.call("GET", `/mgmt/v1/reports/usage?period=${period}`);
    expect(response.status).toBe(200);
    return response.body.data.active_leases as number;
  };

  test("a past month's active_leases is the same before and after its leases are deleted, and so is the current month's", async () => {
    const now = t.clock.now();
    const monthStart = monthStartAnHourAway(now);
    const s = await seats();
    // Five minutes before the month starts: one lease held across the start, one released before.
    t.clock.advance((monthStart - now.getTime()) / 1000 - 300);
    const month = t.clock.now().toISOString().slice(0, 7);
    await s.take("across");
    await s.take("before");
    expect((await s.release("before")).status).toBe(200);
    t.clock.advance(301);
    expect(await report("previous_month")).toBe(1);
    expect(await report(month)).toBe(1);

    t.clock.advance(RETENTION + TTL);
    await s.take("now");
    const before = { past: await report(month), current: await report("current_month") };
    expect(before).toEqual({ past: 1, current: 1 });
    expect(await sweep()).toBe(2);
    expect(leaseIds()).toHaveLength(1);
    expect({ past: await report(month), current: await report("current_month") }).toEqual(before);
    // The month before the lease's ended with no lease held (its end is the first counted month
    // start, the start of the month the lease was taken in).
    const earlier = new Date(monthBefore(monthBefore(monthStart))).toISOString().slice(0, 7);
    expect(await report(earlier)).toBe(0);
  });

  test("no lease counted at a month start is deleted before that month start is counted", async () => {
    const now = t.clock.now();
    const monthStart = monthStartAnHourAway(now);
    const s = await seats();
    t.clock.advance((monthStart - now.getTime()) / 1000 - 60);
    const lease = await s.take("across");
    t.clock.advance(RETENTION + TTL + 1);
    const retention = new LeaseRetention(t.deps);
    // The first steps count the month starts that have passed, one a step, before any delete.
    const steps = [retention.step(), retention.step()];
    expect(steps.map((step) => step.counted)).toEqual([1, 1]);
    expect(steps.map((step) => step.purged)).toEqual([0, 0]);
    expect(leaseIds()).toEqual([lease]);
    const stored = t.deps.sqlite
      .query<{ at: number; environment: string; active: number }, []>(
        "SELECT at, environment, active FROM lease_month_counts ORDER BY at, environment",
      )
      .all();
    // The start of the month the lease was taken in (a minute before `monthStart`), not of now's:
    // in a month's last hour, `monthStart` is the one after next.
    const first = monthBefore(monthStart);
    expect(stored).toEqual([
      { at: first, environment: "live", active: 0 },
      { at: first, environment: "test", active: 0 },
      { at: monthStart, environment: "live", active: 1 },
      { at: monthStart, environment: "test", active: 0 },
    ]);
    expect(retention.step()).toEqual({ counted: 0, scanned: 0, purged: 1, more: false });
  });
});

describe("lease.expired announcements", () => {
  const subscribe = () =>
    new WebhookService(t.deps, { allowPrivateNetworks: true }).create(
      { url: "https://receiver.example.com/hook", events: ["lease.expired"] },
      { actor: { type: "cli", id: "test" }, environment: "live", requestId: null },
    );
  const announced = () =>
    t.deps.sqlite
      .query<{ payload: string }, []>(
        "SELECT e.payload FROM webhook_events e WHERE e.type = 'lease.expired' ORDER BY e.id",
      )
      .all()
      .map((row) => (JSON.parse(row.payload) as { data: { target: { id: string } } }).data.target.id);
  const scanToTheEnd = () => {
    for (let calls = 0; calls < 100; calls++) {
      if (!announceExpiries(t.deps, { leaseScanChunk: 2 }).more) return;
    }
    throw new Error("the scan never ends");
  };

  test("a lease whose expiry is not announced yet stays, however old, and goes once it is", async () => {
    const s = await seats();
    subscribe();
    announceExpiries(t.deps);
    const lease = await s.take("a");
    // The scan does not run (the server was down): the expiry is past the retention, unannounced.
    t.clock.advance(RETENTION + TTL + 1);
    expect(await sweep()).toBe(0);
    expect(leaseIds()).toEqual([lease]);
    scanToTheEnd();
    expect(announced()).toEqual([lease]);
    expect(await sweep()).toBe(1);
    expect(leaseIds()).toEqual([]);
  });

  test("a pass held back by a lease.expired mark older than the retention logs one warning naming the mark", async () => {
    const s = await seats();
    for (let i = 0; i < 5; i++) await s.take(`instance-${i}`);
    t.clock.advance(1);
    subscribe();
    announceExpiries(t.deps);
    const mark = t.clock.now().toISOString();
    const lines: { level: string; msg: string; mark?: string }[] = [];
    const logger = {
      log: (level: string, msg: string, fields: Record<string, unknown> = {}) =>
        lines.push({ level, msg, ...fields }),
    };
    const services = createServices(t.deps, { baseUrl: BASE_URL });
    services.leaseRetention = new LeaseRetention(t.deps, { batch: 2 });
    // Up to date: nothing to say.
    expect(await sweepLeases(services, logger)).toBe(0);
    expect(lines.filter((line) => line.level === "warn")).toEqual([]);
    // The scan does not run for longer than the retention: the pass (three batches, each held back
    // at the mark) warns once.
    t.clock.advance(RETENTION + TTL + 1);
    expect(await sweepLeases(services, logger)).toBe(0);
    expect(lines.filter((line) => line.level === "warn")).toEqual([
      { level: "warn", msg: "lease purge held back by the lease.expired mark", mark },
    ]);
  });

  test("a purge between the chunks of a scan loses none of its expiries", async () => {
    const s = await seats();
    subscribe();
    announceExpiries(t.deps);
    const announcedBefore = [await s.take("old-1"), await s.take("old-2")];
    t.clock.advance(TTL + 1);
    scanToTheEnd();
    const lapsing = [await s.take("new-1"), await s.take("new-2"), await s.take("new-3")];
    // They lapse, and no scan runs for more than the retention (the server was down): when the
    // next scan starts, the expiries it reads are older than the retention, so only its mark
    // keeps them from the purge.
    t.clock.advance(TTL + 1 + RETENTION);
    expect(announceExpiries(t.deps, { leaseScanChunk: 2 }).more).toBe(true);
    // The leases announced before go; the ones the scan is reading stay.
    expect(await sweep()).toBe(2);
    expect(leaseIds().sort()).toEqual([...lapsing].sort());
    scanToTheEnd();
    expect(announced().sort()).toEqual([...announcedBefore, ...lapsing].sort());
    // Announced now, they go too.
    expect(await sweep()).toBe(3);
  });
});

describe("batches", () => {
  test("a backlog goes in batches of at most the batch size, stepping over a live lease at the front", async () => {
    const long = await seats({ lease_ttl_sec: 7 * DAY, lease_heartbeat_sec: DAY });
    await long.take("held");
    const s = await seats();
    for (let i = 0; i < 7; i++) await s.take(`instance-${i}`);
    t.clock.advance(6 * DAY);
    expect((await long.renew("held")).status).toBe(200);
    t.clock.advance(RETENTION - 6 * DAY + TTL + 1);
    const retention = new LeaseRetention(t.deps, { batch: 3 });
    const steps = [];
    for (let step = retention.step(); ; step = retention.step()) {
      if (step.scanned === 0) steps.push(step);
      if (!step.more) break;
    }
    // Eight leases in id order, the live one first: read three at a time, deleted all but it.
    expect(steps).toEqual([
      { counted: 0, scanned: 0, purged: 2, more: true },
      { counted: 0, scanned: 0, purged: 3, more: true },
      { counted: 0, scanned: 0, purged: 2, more: false },
    ]);
    expect(leaseIds()).toHaveLength(1);
    // A later pass starts from the front again and finds nothing more to delete.
    expect(retention.step()).toEqual({ counted: 0, scanned: 0, purged: 0, more: false });
  });

  test("each batch seeks the lease id index where the last one stopped", async () => {
    const { sql } = await sqlPreparedDuring(t.deps.sqlite, () => new LeaseRetention(t.deps));
    const window = sql.find((text) => /^SELECT id FROM leases/.test(text));
    const purge = sql.find((text) => /^DELETE FROM leases/.test(text));
    expect(queryPlan(t.deps.sqlite, window as string)).toBe(
      "SEARCH leases USING COVERING INDEX sqlite_autoindex_leases_1 (id>? AND id<?)",
    );
    expect(queryPlan(t.deps.sqlite, purge as string)).toBe(
      "SEARCH leases USING INDEX sqlite_autoindex_leases_1 (id>? AND id<?)",
    );
  });
});

describe("a pass that fails or is stopped", () => {
  type Line = { level: string; msg: string } & Record<string, unknown>;
  const recorder = () => {
    const lines: Line[] = [];
    return {
      lines,
      log: (level: string, msg: string, fields: Record<string, unknown> = {}) =>
        lines.push({ level, msg, ...fields }),
    };
  };
  const turn = () => new Promise<void>((resolve) => setImmediate(resolve));
  /** Waits, up to two seconds, for the sweeper's timer to bring `done` about. */
  const until = async (done: () => boolean) => {
    for (let waited = 0; waited < 2_000 && !done(); waited += 5) await Bun.sleep(5);
  };
  /** Finished leases, all past their retention, in id order. */
  const finished = async (count: number) => {
    const s = await seats();
    for (let i = 0; i < count; i++) await s.take(`instance-${i}`);
    t.clock.advance(RETENTION + TTL + 1);
    const ids = leaseIds();
    expect(ids).toHaveLength(count);
    return ids;
  };
  const withBatches = (batch: number) => {
    const services = createServices(t.deps, { baseUrl: BASE_URL });
    services.leaseRetention = new LeaseRetention(t.deps, { batch });
    return services;
  };
  /** A real store failure: SQLite refuses to delete this lease (a trigger that raises). */
  const failDeleting = (id: string) =>
    t.deps.sqlite.run(
      `CREATE TRIGGER refuse_purge BEFORE DELETE ON leases WHEN old.id = '${id}'
       BEGIN SELECT RAISE(ABORT, 'simulated store failure'); END`,
    );

  test("a store error in the middle of a pass is logged with the leases deleted before it, the failing batch is left whole, and the next pass deletes the rest", async () => {
    const ids = await finished(9);
    const services = withBatches(3);
    const logger = recorder();
    // The fifth lease is in the second batch of three.
    failDeleting(ids[4] as string);
    // The first batch of three went before the failure, and the log says so.
    expect(await sweepLeases(services, logger)).toBe(3);
    expect(logger.lines).toEqual([
      {
        level: "error",
        msg: "lease purge failed",
        error: expect.stringContaining("simulated store failure"),
        leases: 3,
      },
    ]);
    // The first batch went; the second is all there, the fourth lease (which the same statement
    // deleted before reaching the fifth) included, and the counter still matches the rows.
    expect(leaseIds()).toEqual(ids.slice(3));
    expect(counters()).toEqual({ kept: 6, actual: 6 });

    t.deps.sqlite.run("DROP TRIGGER refuse_purge");
    expect(await sweepLeases(services, logger)).toBe(6);
    expect(leaseIds()).toEqual([]);
    expect(counters()).toEqual({ kept: 0, actual: 0 });
    expect(logger.lines.at(-1)).toEqual({ level: "info", msg: "lease purge", leases: 6 });
  });

  test("the sweeper starts the next pass on its next run after a pass that failed", async () => {
    const ids = await finished(4);
    const logger = recorder();
    failDeleting(ids[0] as string);
    const stop = startSweeper(withBatches(3), logger, 20);
    try {
      await until(() => logger.lines.some((l) => l.msg === "lease purge failed"));
      expect(logger.lines.filter((l) => l.level === "error").map((l) => l.msg)).toContain(
        "lease purge failed",
      );
      expect(leaseIds()).toEqual(ids);
      t.deps.sqlite.run("DROP TRIGGER refuse_purge");
      await until(() => leaseIds().length === 0);
      expect(leaseIds()).toEqual([]);
    } finally {
      stop();
    }
    expect(logger.lines).toContainEqual({ level: "info", msg: "lease purge", leases: 4 });
  });

  test("stopping the sweeper during a pass ends it between batches: whole batches went, nothing goes after, and the log says how many", async () => {
    const ids = await finished(20);
    const logger = recorder();
    const stop = startSweeper(withBatches(2), logger);
    try {
      // The pass deletes a batch per turn of the event loop: stop it once one has gone, as a
      // server's shutdown does (it stops the sweeper, then closes the store).
      for (let n = 0; n < 1_000 && leaseIds().length === ids.length; n++) await turn();
    } finally {
      stop();
    }
    const left = leaseIds();
    expect(left.length).toBeLessThan(ids.length);
    expect(left.length).toBeGreaterThan(0);
    expect((ids.length - left.length) % 2).toBe(0);
    expect(left).toEqual(ids.slice(ids.length - left.length));
    for (let n = 0; n < 100; n++) await turn();
    expect(leaseIds()).toEqual(left);
    expect(counters()).toEqual({ kept: left.length, actual: left.length });
    expect(logger.lines.filter((l) => l.msg.startsWith("lease purge"))).toEqual([
      { level: "info", msg: "lease purge", leases: ids.length - left.length },
    ]);
  });
});
