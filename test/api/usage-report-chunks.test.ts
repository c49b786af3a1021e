import { afterEach, beforeEach, expect, test } from "bun:test";
import { IdGenerator } from "../../src/domain/ids.ts";
import type { Environment } from "../../src/domain/scopes.ts";
import { UsageReportService } from "../../src/modules/reports/service.ts";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";

/**
 * The usage report counts a chunk of rows at a time, with the event loop turning between chunks
 * (modules/reports/service.ts): at a million licenses one statement per figure held every other
 * request up for 60-800 ms. Chunked, each figure must still equal the count of the whole table.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
  t.clock.freeze();
});
afterEach(() => t.close());

const DAY = 86_400_000;
/** Where the tests stand: mid-March 2027; the previous month is February. */
const NOW = Date.UTC(2027, 2, 14, 12);
const FEB = Date.UTC(2027, 1, 1);
const MAR = Date.UTC(2027, 2, 1);

/**
 * Licenses, activations and leases in both environments, made over the months before NOW in a
 * fixed pseudo-random spread, in every state the figures tell apart, plus a batch of licenses and
 * activations made in one millisecond (more than a chunk of the tests' chunk size).
 */
function seed() {
  const f = factories(t);
  let state = 11;
  const random = () => {
    state = (state * 1_103_515_245 + 12_345) % 2_147_483_648;
    return state / 2_147_483_648;
  };
  const ids = new IdGenerator();
  const insertLease = t.deps.sqlite.prepare<
    unknown,
    [string, string, string, string, string, number, number, number | null]
  >(
    `INSERT INTO leases (id, license_id, activation_id, instance_id, status, created_at, expires_at, released_at)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
  );
  const from = Date.UTC(2026, 10, 1);
  const sameMillisecond = Date.UTC(2027, 1, 20);
  const leases: {
    created: number;
    expires: number;
    released: number | null;
    license: string;
    activation: string;
  }[] = [];
  for (const environment of ["live", "test"] as const) {
    const { product, policy } = f.catalog(environment);
    for (let i = 0; i < 40; i++) {
      const created = i < 7 ? sameMillisecond : from + Math.floor(random() * (NOW - from));
      const at = (offset: number) => new Date(created + offset);
      const ending = i % 4;
      const { row } = f.license({
        productId: product.id,
        policyId: policy.id,
        environment,
        createdAt: new Date(created),
        // Revoked, suspended or expiring at some time after it was made (some before a month's end).
        ...(ending === 1 ? { status: "revoked" as const, revokedAt: at(random() * 60 * DAY) } : {}),
        ...(ending === 2 ? { status: "suspended" as const, suspendedAt: at(random() * 60 * DAY) } : {}),
        ...(ending === 3 ? { expiresAt: at(random() * 60 * DAY) } : {}),
      });
      const activation = f.activation({
        productId: product.id,
        licenseId: row.id,
        environment,
        deviceThumbprint: `${i}`.padStart(64, "0"),
        activatedAt: new Date(created),
        ...(random() < 0.4 ? { status: "deactivated" as const, deactivatedAt: at(random() * 40 * DAY) } : {}),
      });
      const leaseCreated = created + Math.floor(random() * 10 * DAY);
      const expires = leaseCreated + Math.floor(random() * 40 * DAY);
      const released = random() < 0.3 ? leaseCreated + Math.floor(random() * (expires - leaseCreated)) : null;
      if (leaseCreated < NOW)
        leases.push({ created: leaseCreated, expires, released, license: row.id, activation: activation.id });
    }
  }
  leases.sort((a, b) => a.created - b.created);
  leases.forEach((lease, i) => {
    insertLease.run(
      ids.next("lease", lease.created),
      lease.license,
      lease.activation,
      `i-${i}`,
      lease.released === null ? "active" : "released",
      lease.created,
      lease.expires,
      lease.released,
    );
  });
}

/**
 * Each figure as one statement over the whole table, as the report counted before chunks: the state
 * at `at` of what was made before `madeBefore` (the period's end, or just after now).
 */
function wholeTable(environment: Environment, start: number, end: number, at: number, madeBefore: number) {
  const count = (sql: string, ...params: (string | number)[]) =>
    t.deps.sqlite.query<{ n: number }, (string | number)[]>(sql).get(...params)?.n ?? 0;
  return {
    new_activations: count(
      "SELECT count(*) AS n FROM activations WHERE environment = ? AND activated_at >= ? AND activated_at < ?",
      environment,
      start,
      end,
    ),
    active_machines: count(
      `SELECT count(*) AS n FROM activations a JOIN licenses l ON l.id = a.license_id
       WHERE a.environment = ?1 AND a.activated_at < ?3
       AND (a.deactivated_at IS NULL OR a.deactivated_at > ?2) AND (l.revoked_at IS NULL OR l.revoked_at > ?2)`,
      environment,
      at,
      madeBefore,
    ),
    active_licenses: count(
      `SELECT count(*) AS n FROM licenses WHERE environment = ?1 AND created_at < ?3
       AND (revoked_at IS NULL OR revoked_at > ?2) AND (suspended_at IS NULL OR suspended_at > ?2)
       AND (expires_at IS NULL OR expires_at > ?2)`,
      environment,
      at,
      madeBefore,
    ),
    active_leases: count(
      `SELECT count(*) AS n FROM leases l JOIN licenses c ON c.id = l.license_id WHERE c.environment = ?1
       AND l.status IN ('active', 'released') AND l.expires_at > ?2
       AND l.created_at < ?3 AND (l.released_at IS NULL OR l.released_at > ?2)`,
      environment,
      at,
      madeBefore,
    ),
  };
}

const moveClockTo = (ms: number) => t.clock.advance((ms - t.clock.now().getTime()) / 1000);

test("counted two rows a chunk, every figure equals the whole table's, for this month and the last, in both environments", async () => {
  seed();
  moveClockTo(NOW);
  const chunked = new UsageReportService(t.deps, { entries: 2, leases: 2 });
  for (const environment of ["live", "test"] as const) {
    const current = await chunked.report(environment, "current_month");
    const previous = await chunked.report(environment, "previous_month");
    const { period: _current, ...currentFigures } = current;
    const { period: _previous, ...previousFigures } = previous;
    expect(currentFigures).toEqual(wholeTable(environment, MAR, Date.UTC(2027, 3, 1), NOW, NOW + 1));
    expect(previousFigures).toEqual(wholeTable(environment, FEB, MAR, MAR, MAR));
    // The spread gives each figure something to count, so a chunk that dropped rows would show.
    for (const figures of [currentFigures, previousFigures]) {
      expect(Object.values(figures).every((n) => n > 0)).toBe(true);
    }
  }
});

test("the chunked figures equal those counted in one chunk each", async () => {
  seed();
  moveClockTo(NOW);
  const small = new UsageReportService(t.deps, { entries: 3, leases: 1 });
  const whole = new UsageReportService(t.deps, { entries: 1_000_000, leases: 1_000_000 });
  for (const period of ["current_month", "previous_month", "2027-01", "2026-11"]) {
    expect(await small.report("live", period)).toEqual(await whole.report("live", period));
  }
});

test("the report lets other work run between its chunks", async () => {
  seed();
  moveClockTo(NOW);
  const report = new UsageReportService(t.deps, { entries: 4, leases: 4 });
  // Other work: a task that queues itself again at every turn of the event loop.
  let turns = 0;
  let reported = false;
  const other = () => {
    if (reported) return;
    turns++;
    setImmediate(other);
  };
  setImmediate(other);
  await report.report("live", "current_month");
  reported = true;
  // A report counted in one go would have ended before the loop turned once.
  expect(turns).toBeGreaterThan(10);
});

test("an empty environment reports zeros", async () => {
  moveClockTo(NOW);
  const report = await new UsageReportService(t.deps, { entries: 2, leases: 2 }).report("test", undefined);
  expect(report).toMatchObject({
    new_activations: 0,
    active_machines: 0,
    active_licenses: 0,
    active_leases: 0,
  });
});

test("each chunk of a figure seeks its covering index, never the table, but for revoked licenses' devices; a month with licenses changed since seeks their history by license", async () => {
  const { sql } = await sqlPreparedDuring(t.deps.sqlite, () => new UsageReportService(t.deps));
  const all = sql.map((text) => queryPlan(t.deps.sqlite, text));
  const history = all.filter((plan) => plan.includes("license_state_history"));
  // Whether any license changed after the moment counted: one seek of the change-time index.
  expect(history.filter((plan) => !plan.includes("SEARCH l "))).toEqual([
    "SEARCH license_state_history USING COVERING INDEX license_state_history_changed (changed_at>?)",
  ]);
  // Licenses as they were: the window's index range, each license's first later change by key.
  expect(history.filter((plan) => plan.includes("SEARCH l "))).toEqual([
    [
      "SEARCH l USING INDEX licenses_env_lifetime (environment=? AND created_at>? AND created_at<?)",
      "SEARCH h USING INDEX sqlite_autoindex_license_state_history_1 (license_id=? AND changed_at=?) LEFT-JOIN",
      "CORRELATED SCALAR SUBQUERY 1",
      "SEARCH p USING COVERING INDEX sqlite_autoindex_license_state_history_1 (license_id=? AND changed_at>?)",
    ].join(" | "),
  ]);
  // Devices of revoked licenses: the licenses' window by their index (which holds revoked_at, so
  // only a revoked license's row is read), then its activations by license.
  const ofRevoked = all.filter((plan) => plan.includes("SEARCH a "));
  expect(ofRevoked).toEqual([
    "SEARCH l USING INDEX licenses_env_lifetime (environment=? AND created_at>? AND created_at<?) | SEARCH a USING INDEX activations_license_device (license_id=?)",
  ]);
  const plans = all.filter((plan) => !history.includes(plan) && !ofRevoked.includes(plan));
  expect(plans.filter((plan) => plan.includes("licenses_env_lifetime"))).toHaveLength(2);
  expect(plans.filter((plan) => plan.includes("activations_env_activated"))).toHaveLength(3);
  for (const plan of plans) {
    expect(plan).toMatch(
      /^SEARCH (licenses USING COVERING INDEX licenses_env_lifetime|activations USING COVERING INDEX activations_env_activated) \(environment=\? AND (created_at|activated_at)>\? AND (created_at|activated_at)<\?\)$/,
    );
  }
});
