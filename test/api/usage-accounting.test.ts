import { afterEach, beforeEach, expect, test } from "bun:test";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";
import {
  activatedDevice,
  heartbeatPath,
  proofCall,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";

/**
 * The plan report and the usage report against a known script of calls: every number they show
 * is the number of things that happened.
 */
let t: TestContext;
let fx: RuntimeFixture;
let revokedFx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  t.workspace.setPlan("business");
  fx = await runtimeFixture(t, {
    policy: { max_machines: 10, max_concurrent: 2, concurrency_unit: "instance", lease_ttl_sec: 600 },
  });
  revokedFx = await runtimeFixture(t);
});
afterEach(() => t.close());

const DIGEST = machineInfoDigest({ os: "linux", arch: "x64" });

test("a known script of management and runtime calls shows up exactly in the plan and usage reports", async () => {
  const plan = async () => (await t.call("GET", "/mgmt/v1/plan")).body.data;
  const before = await plan();
  const testKeyActivation = await runtimeFixture(t, { key: t.keys.test });

  // Management: 4 counted requests here (the plan report is exempt; a bad key is not a request
  // of the workspace), 4 by the test-environment fixture, 1 revocation below: 9.
  expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
  expect(
    (await t.call("POST", "/mgmt/v1/customers", { body: { name: "Ada" }, headers: t.idem() })).status,
  ).toBe(201);
  expect((await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}`)).status).toBe(200);
  expect((await t.call("GET", "/mgmt/v1/products", { key: "lsk_live_not-a-key" })).status).toBe(401);
  expect((await t.call("GET", "/mgmt/v1/reports/usage")).status).toBe(200);

  // Runtime: 1 trust bundle (test fixture), 4 activations (one in test), 3 check-ins, 1 lease,
  // 1 deactivation, 1 signed time: 11. Revoked denials add nothing.
  const a = await activatedDevice(t, fx);
  const b = await activatedDevice(t, fx);
  const r = await activatedDevice(t, revokedFx);
  await activatedDevice(t, testKeyActivation);
  for (const device of [a, b, a]) {
    const beat = await proofCall(
      t,
      device.device,
      "POST",
      heartbeatPath(device.activationId),
      device.activationId,
      {
        machine_info_digest: DIGEST,
      },
    );
    expect(beat.status).toBe(200);
  }
  const lease = await proofCall(t, a.device, "POST", "/runtime/v1/leases", a.activationId, {
    activation_id: a.activationId,
    instance_id: "instance-1",
  });
  expect(lease.status).toBe(201);
  const gone = await proofCall(
    t,
    b.device,
    "DELETE",
    `/runtime/v1/activations/${b.activationId}`,
    b.activationId,
  );
  expect(gone.status).toBe(200);
  const time = await t.call("POST", "/runtime/v1/time", {
    key: null,
    body: { product_id: fx.productId, nonce: "a-time-nonce-of-enough-length" },
  });
  expect(time.status).toBe(200);
  expect((await t.call("DELETE", `/mgmt/v1/licenses/${revokedFx.licenseId}`)).status).toBe(204);
  for (let i = 0; i < 2; i++) {
    const denied = await proofCall(t, r.device, "POST", heartbeatPath(r.activationId), r.activationId, {
      machine_info_digest: DIGEST,
    });
    expect(denied.body.error.code).toBe("LICENSE_REVOKED");
  }

  const after = await plan();
  expect(after.quotas.management_requests.used - before.quotas.management_requests.used).toBe(9);
  expect(after.quotas.runtime_requests.used - before.quotas.runtime_requests.used).toBe(11);
  expect(after.quotas.runtime_requests.remaining).toBe(
    after.quotas.runtime_requests.limit - after.quotas.runtime_requests.used,
  );
  // Live licenses only: the fixture's two, one of them revoked.
  expect(after.quotas.licenses.used).toBe(1);

  const live = (await t.call("GET", "/mgmt/v1/reports/usage")).body.data;
  // Machines: a only; b was deactivated, and r's license revoked.
  expect(live).toMatchObject({
    new_activations: 3,
    active_machines: 1,
    active_licenses: 1,
    active_leases: 1,
  });
  const test = (await t.call("GET", "/mgmt/v1/reports/usage", { key: t.keys.test })).body.data;
  expect(test).toMatchObject({
    new_activations: 1,
    active_machines: 1,
    active_licenses: 1,
    active_leases: 0,
  });
});

test("the plan report lists what the configured plan lacks, and nothing on a plan that has everything", async () => {
  const unavailable = async () =>
    (await t.call("GET", "/mgmt/v1/plan")).body.data.unavailable_features
      .map((f: { key: string }) => f.key)
      .sort();
  expect(await unavailable()).toEqual([]);
  t.workspace.setPlan("personal");
  expect(await unavailable()).toEqual([
    "billing_integration",
    "browser_runtime",
    "sealed_files",
    "trial_licenses",
  ]);
  t.workspace.setPlan("free");
  expect(await unavailable()).toEqual([
    "billing_integration",
    "browser_runtime",
    "email_license_verification",
    "sealed_files",
    "trial_licenses",
    "webhooks",
  ]);
});

// The report's other figures: test/api/usage-report-chunks.test.ts.
test("the usage report's seat count reads the leases a chunk of their id index at a time, never every license", async () => {
  // One statement that walked each license's leases took 0.8 s at a million licenses, with every
  // heartbeat waiting; by the lease id index, a chunk of leases takes a few milliseconds.
  const { sql } = await sqlPreparedDuring(t.deps.sqlite, () => t.call("GET", "/mgmt/v1/reports/usage"));
  const activeLeases = sql.find((text) => /FROM leases l/.test(text));
  expect(activeLeases).toBeDefined();
  expect(queryPlan(t.deps.sqlite, activeLeases as string)).toStartWith(
    "SEARCH l USING INDEX sqlite_autoindex_leases_1 (id>? AND id<?) | SEARCH c USING INDEX sqlite_autoindex_licenses_1 (id=?)",
  );
});

test("a past month's active licenses stay as they were at its end after licenses are reinstated, renewed or suspended since", async () => {
  const DAY = 86_400;
  const toNextMonth = (day: number) => {
    const now = t.clock.now();
    const target = Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, day);
    t.clock.advance(Math.ceil((target - now.getTime()) / 1000));
  };
  const iso = (inDays: number) => new Date(t.clock.now().getTime() + inDays * DAY * 1000).toISOString();
  const license = async (body: Record<string, unknown> = {}) => {
    const created = await t.call("POST", "/mgmt/v1/licenses", {
      body: { product_id: fx.productId, policy_id: fx.policyId, ...body },
      headers: t.idem(),
    });
    expect(created.status).toBe(201);
    return created.body.data.public_id as string;
  };
  const patch = async (id: string, body: Record<string, unknown>) =>
    expect((await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body })).status).toBe(200);
  const activeIn = async (period: string) =>
    (await t.call("GET", `/mgmt/v1/reports/usage?period=${period}`)).body.data.active_licenses as number;

  toNextMonth(2);
  const month = t.clock.now().toISOString().slice(0, 7);
  const suspendedAtEnd = await license();
  const expiredAtEnd = await license({ expires_at: iso(10) });
  const suspendedSince = await license();
  const renewedTwice = await license({ expires_at: iso(40) });
  const backInMonth = await license();
  t.clock.advance(20 * DAY);
  await patch(suspendedAtEnd, { status_action: "suspended" });
  await patch(backInMonth, { status_action: "suspended" });
  t.clock.advance(DAY);
  await patch(backInMonth, { status_action: "active" });
  toNextMonth(2);
  const asItWas = await activeIn(month);
  // The two fixtures' licenses, suspendedSince, renewedTwice and backInMonth; not the suspended or
  // the expired one.
  expect(asItWas).toBe(5);
  const nowBefore = await activeIn("current_month");

  await patch(suspendedAtEnd, { status_action: "active" });
  await patch(expiredAtEnd, { expires_at: iso(30) });
  await patch(suspendedSince, { status_action: "suspended" });
  t.clock.advance(DAY);
  await patch(renewedTwice, { expires_at: iso(60) });
  await patch(renewedTwice, { expires_at: iso(90) });

  expect(await activeIn(month)).toBe(asItWas);
  // The current month shows the changes: two back, one gone.
  expect(await activeIn("current_month")).toBe(nowBefore + 1);
  // Later changes in a month add no history: one row per license and month.
  const kept = t.deps.sqlite
    .query("SELECT count(*) AS n FROM license_state_history WHERE license_id = ?")
    .get(renewedTwice) as { n: number };
  expect(kept.n).toBe(1);
});
