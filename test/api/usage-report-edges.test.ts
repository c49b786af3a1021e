import { afterEach, beforeEach, expect, test } from "bun:test";
import { LeaseRetention } from "../../src/modules/leases/retention.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { activatedDevice, proofCall, type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * The usage report's figures at the edges of a period: what was made at the very first
 * millisecond of the next month, and devices whose license was revoked. A month's figures are the
 * state at its end of what was made before it (docs/api.md, "Usage report").
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
  t.clock.freeze();
});
afterEach(() => t.close());

const HOUR = 3_600_000;
const DAY = 24 * HOUR;
const goTo = (ms: number) => t.clock.advance((ms - t.clock.now().getTime()) / 1000);
/** The first millisecond of the month `ahead` months after the current one (UTC). */
const monthStartAhead = (ahead: number) => {
  const now = t.clock.now();
  return Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + ahead, 1);
};
const label = (ms: number) => new Date(ms).toISOString().slice(0, 7);
const figures = async (period: string) => {
  const response = await t.call("GET", `/mgmt/v1/reports/usage?period=${period}`);
  expect(response.status).toBe(200);
  const { period: _period, ...counts } = response.body.data;
  return counts;
};

type Device = Awaited<ReturnType<typeof activatedDevice>>;
const takeSeat = async (d: Device, instance: string): Promise<string> => {
  const taken = await proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, {
    activation_id: d.activationId,
    instance_id: instance,
  });
  expect(taken.status).toBe(201);
  return taken.body.data.lease_id;
};

test("a license, device or seat made at the next month's first millisecond is the next month's, while a deactivation or release then counts as made", async () => {
  const fx: RuntimeFixture = await runtimeFixture(t, {
    policy: { max_machines: 10, max_concurrent: 10, concurrency_unit: "instance", lease_ttl_sec: 600 },
  });
  // Month A is [monthA, monthB); month B is [monthB, monthC).
  const monthA = monthStartAhead(1);
  const monthB = monthStartAhead(2);
  const monthC = monthStartAhead(3);

  // The last millisecond of A: two devices, each with a seat that outlives A's end.
  goTo(monthB - 1);
  const kept = await activatedDevice(t, fx);
  await takeSeat(kept, "kept");
  const leaving = await activatedDevice(t, fx);
  const leavingSeat = await takeSeat(leaving, "leaving");

  // The first millisecond of B: one device leaves (its seat released first), another arrives
  // with a seat, and a license is made.
  goTo(monthB);
  const released = await proofCall(
    t,
    leaving.device,
    "DELETE",
    `/runtime/v1/leases/${leavingSeat}`,
    leaving.activationId,
    {
      instance_id: "leaving",
    },
  );
  expect(released.status).toBe(200);
  const gone = await proofCall(
    t,
    leaving.device,
    "DELETE",
    `/runtime/v1/activations/${leaving.activationId}`,
    leaving.activationId,
  );
  expect(gone.status).toBe(200);
  const arriving = await activatedDevice(t, fx);
  await takeSeat(arriving, "arriving");
  const license = await t.call("POST", "/mgmt/v1/licenses", {
    body: { product_id: fx.productId, policy_id: fx.policyId },
    headers: t.idem(),
  });
  expect(license.status).toBe(201);

  goTo(monthC + DAY);
  const monthAFigures = {
    new_activations: 2,
    // `kept` only: `leaving` was deactivated and `arriving` made at A's end.
    active_machines: 1,
    // The fixture's license only: the new one was made at A's end.
    active_licenses: 1,
    // `kept`'s seat only: `leaving`'s was released and `arriving`'s taken at A's end.
    active_leases: 1,
  };
  const monthBFigures = { new_activations: 1, active_machines: 2, active_licenses: 2, active_leases: 0 };
  expect(await figures(label(monthA))).toEqual(monthAFigures);
  expect(await figures(label(monthB))).toEqual(monthBFigures);

  // The seats at each month start, once counted and stored (and the finished leases purged), agree.
  await new LeaseRetention(t.deps).pass();
  expect(t.deps.sqlite.query("SELECT count(*) AS n FROM leases").get()).toEqual({ n: 0 });
  const stored = t.deps.sqlite
    .query<{ active: number }, [number]>(
      "SELECT active FROM lease_month_counts WHERE environment = 'live' AND at = ?",
    )
    .get(monthB);
  expect(stored?.active).toBe(1);
  expect(await figures(label(monthA))).toEqual(monthAFigures);
});

test("asked at the very moment a month ends, the month's report already leaves out what is made in that moment", async () => {
  const fx: RuntimeFixture = await runtimeFixture(t, { policy: { max_machines: 10 } });
  const monthA = monthStartAhead(1);
  const monthB = monthStartAhead(2);
  goTo(monthB - 1);
  await activatedDevice(t, fx);
  goTo(monthB);
  await activatedDevice(t, fx);
  const atTheEnd = await figures(label(monthA));
  goTo(monthB + 1);
  expect(atTheEnd).toEqual(await figures(label(monthA)));
  expect(atTheEnd).toMatchObject({ new_activations: 1, active_machines: 1, active_licenses: 1 });
});

test("active machines leave out the devices of a license revoked by the period's end, and a month that ended before the revocation still counts them", async () => {
  const revokedLater = await runtimeFixture(t, { policy: { max_machines: 5 } });
  const revokedAtEnd = await runtimeFixture(t, { policy: { max_machines: 5 } });
  const kept = await runtimeFixture(t, { policy: { max_machines: 5 } });
  const monthA = monthStartAhead(1);
  const monthB = monthStartAhead(2);

  goTo(monthA + DAY);
  for (const fx of [revokedLater, revokedLater, revokedAtEnd, kept]) await activatedDevice(t, fx);
  expect(await figures("current_month")).toMatchObject({ active_machines: 4, active_licenses: 3 });

  // At A's end exactly: the revocation counts as made by then (as a license's own figure does).
  goTo(monthB);
  expect((await t.call("DELETE", `/mgmt/v1/licenses/${revokedAtEnd.licenseId}`)).status).toBe(204);
  goTo(monthB + DAY);
  expect((await t.call("DELETE", `/mgmt/v1/licenses/${revokedLater.licenseId}`)).status).toBe(204);

  expect(await figures(label(monthA))).toMatchObject({ active_machines: 3, active_licenses: 2 });
  expect(await figures("current_month")).toMatchObject({ active_machines: 1, active_licenses: 1 });
  // The devices were never deactivated: only the report leaves them out.
  const listed = await t.call("GET", `/mgmt/v1/licenses/${revokedLater.licenseId}/activations`);
  expect(listed.body.data.map((a: { status: string }) => a.status)).toEqual(["active", "active"]);
});
