import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { expectSignedEnvelope } from "../support/envelope.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { activatedDevice, proofCall, type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: {
      max_machines: 10,
      max_concurrent: 2,
      concurrency_unit: "instance",
      lease_ttl_sec: 600,
      lease_heartbeat_sec: 120,
    },
  });
});
afterEach(() => t.close());

type Device = Awaited<ReturnType<typeof activatedDevice>>;
const acquire = (d: Device, instance: string) =>
  proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, {
    activation_id: d.activationId,
    instance_id: instance,
  });
const keep = (d: Device, leaseId: string, instance: string) =>
  proofCall(t, d.device, "POST", `/runtime/v1/leases/${leaseId}/heartbeat`, d.activationId, {
    instance_id: instance,
  });
const release = (d: Device, leaseId: string, instance: string) =>
  proofCall(t, d.device, "DELETE", `/runtime/v1/leases/${leaseId}`, d.activationId, {
    instance_id: instance,
  });

describe("happy path", () => {
  test("a seat is taken, kept and released with signed answers", async () => {
    const d = await activatedDevice(t, fx);
    const taken = await acquire(d, "instance-a");
    expect(taken.status).toBe(201);
    expectSignedEnvelope(taken.body, {
      status: 201,
      nonce: taken.body.response_assertion.nonce,
      productId: fx.productId,
      bundle: fx.bundle,
    });
    const lease = taken.body.data;
    expect(lease).toMatchObject({
      activation_id: d.activationId,
      instance_id: "instance-a",
      heartbeat_in: 120,
    });
    // The test clock runs with real time, so a second may tick between the server's reading
    // and the signed server_time: the TTL is 600 s from the moment of the call, give or take it.
    const ttl = lease.expires_at - taken.body.response_assertion.server_time;
    expect(ttl).toBeGreaterThanOrEqual(599);
    expect(ttl).toBeLessThanOrEqual(600);
    t.clock.advance(100);
    const kept = await keep(d, lease.lease_id, "instance-a");
    expect(kept.status).toBe(200);
    expect(kept.body.data).toMatchObject({ lease_id: lease.lease_id, activation_id: d.activationId });
    const extended = kept.body.data.expires_at - lease.expires_at;
    expect(extended).toBeGreaterThanOrEqual(100);
    expect(extended).toBeLessThanOrEqual(101);
    const released = await release(d, lease.lease_id, "instance-a");
    expect(released.status).toBe(200);
    expect(released.body.data).toEqual({
      lease_id: lease.lease_id,
      activation_id: d.activationId,
      status: "released",
    });
    const twice = await release(d, lease.lease_id, "instance-a");
    expect(twice.status).toBe(422);
    expect(twice.body.error).toMatchObject({ code: "INVALID_TRANSITION", details: { from: "released" } });
  });

  test("acquiring again for the same instance returns its lease instead of a second seat", async () => {
    const d = await activatedDevice(t, fx);
    const first = await acquire(d, "instance-a");
    const again = await acquire(d, "instance-a");
    expect(again.body.data.lease_id).toBe(first.body.data.lease_id);
    expect((await acquire(d, "instance-b")).status).toBe(201);
  });

  test("with concurrency_unit device, every instance on one device shares its seat", async () => {
    const perDevice = await runtimeFixture(t, {
      policy: { max_machines: 5, max_concurrent: 1, concurrency_unit: "device" },
    });
    const one = await activatedDevice(t, perDevice);
    expect((await acquire(one, "a")).status).toBe(201);
    expect((await acquire(one, "b")).status).toBe(201);
    const other = await activatedDevice(t, perDevice);
    expect((await acquire(other, "c")).status).toBe(409);
  });
});

describe("seats", () => {
  test("no free seat answers 409 CONCURRENCY_LIMIT_REACHED, retryable", async () => {
    const d = await activatedDevice(t, fx);
    await acquire(d, "a");
    await acquire(d, "b");
    const third = await acquire(d, "c");
    expect(third.status).toBe(409);
    expect(third.body.error).toMatchObject({
      code: "CONCURRENCY_LIMIT_REACHED",
      retryable: true,
      details: { max_concurrent: 2 },
    });
  });

  test("a lease not kept for lease_ttl_sec expires and frees its seat", async () => {
    const d = await activatedDevice(t, fx);
    const a = (await acquire(d, "a")).body.data;
    await acquire(d, "b");
    t.clock.advance(601);
    expect((await acquire(d, "c")).status).toBe(201);
    const late = await keep(d, a.lease_id, "a");
    expect(late.status).toBe(422);
    expect(late.body.error.code).toBe("LEASE_EXPIRED");
    expect((await release(d, a.lease_id, "a")).body.error.code).toBe("LEASE_EXPIRED");
  });

  test("a lease never outlasts its license: acquire and renew end at the license's expiry", async () => {
    t.close();
    t = createTestContext();
    const endsInSec = 200;
    fx = await runtimeFixture(t, {
      policy: { max_machines: 10, max_concurrent: 1, concurrency_unit: "instance", lease_ttl_sec: 600 },
      license: { expires_at: new Date(t.clock.now().getTime() + endsInSec * 1000).toISOString() },
    });
    const licenseEnds = Math.floor(t.clock.now().getTime() / 1000) + endsInSec;
    const d = await activatedDevice(t, fx);
    const taken = await acquire(d, "a");
    expect(taken.status).toBe(201);
    expect(taken.body.data.expires_at).toBe(licenseEnds);
    t.clock.advance(100);
    const kept = await keep(d, taken.body.data.lease_id, "a");
    expect(kept.status).toBe(200);
    expect(kept.body.data.expires_at).toBe(licenseEnds);
    // Extended by the vendor, the license lets the next renewal run its full lease_ttl_sec.
    const later = new Date(t.clock.now().getTime() + 3_600_000);
    const extended = await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, {
      body: { expires_at: later.toISOString() },
    });
    expect(extended.status).toBe(200);
    const renewed = await keep(d, taken.body.data.lease_id, "a");
    expect(renewed.body.data.expires_at).toBe(Math.floor(t.clock.now().getTime() / 1000) + 600);
  });

  test("a released lease frees its seat and answers 410 to a heartbeat", async () => {
    const d = await activatedDevice(t, fx);
    const a = (await acquire(d, "a")).body.data;
    await acquire(d, "b");
    await release(d, a.lease_id, "a");
    expect((await acquire(d, "c")).status).toBe(201);
    const response = await keep(d, a.lease_id, "a");
    expect(response.status).toBe(410);
    expect(response.body.error.code).toBe("LEASE_RELEASED");
  });

  test("deactivating a device releases its leases", async () => {
    const d = await activatedDevice(t, fx);
    await acquire(d, "a");
    await acquire(d, "b");
    await proofCall(t, d.device, "DELETE", `/runtime/v1/activations/${d.activationId}`, d.activationId);
    const other = await activatedDevice(t, fx);
    expect((await acquire(other, "c")).status).toBe(201);
  });
});

describe("seats follow machine slots", () => {
  test("a device culled from its slot gets no seat and loses the ones it held", async () => {
    const slots = await runtimeFixture(t, {
      policy: {
        license_type: "subscription",
        max_machines: 1,
        max_concurrent: 1,
        heartbeat_sec: 3600,
        network_grace_sec: 7200,
        lease_ttl_sec: 86_400,
        lease_heartbeat_sec: 3600,
      },
    });
    const stale = await activatedDevice(t, slots);
    const held = (await acquire(stale, "a")).body.data;
    t.clock.advance(3600 + 7200 + 1);
    const fresh = await activatedDevice(t, slots);
    const renew = await keep(stale, held.lease_id, "a");
    expect(renew.status).toBe(410);
    expect(renew.body.error).toMatchObject({ code: "ACTIVATION_DEACTIVATED", details: { reason: "culled" } });
    expect(renew.body.response_signature).toBeDefined();
    expect((await acquire(stale, "b")).status).toBe(410);
    expect((await acquire(fresh, "c")).status).toBe(201);
  });
});

describe("errors", () => {
  test("another instance id answers 422 and changes nothing", async () => {
    const d = await activatedDevice(t, fx);
    const a = (await acquire(d, "a")).body.data;
    expect((await keep(d, a.lease_id, "x")).body.error.code).toBe("LEASE_INSTANCE_MISMATCH");
    expect((await release(d, a.lease_id, "x")).status).toBe(422);
    expect((await keep(d, a.lease_id, "a")).status).toBe(200);
  });

  test("another device's lease does not exist for this device", async () => {
    const d = await activatedDevice(t, fx);
    const other = await activatedDevice(t, fx);
    const a = (await acquire(d, "a")).body.data;
    expect((await keep(other, a.lease_id, "a")).status).toBe(404);
  });

  test("the proof must come from the activation the body names", async () => {
    const d = await activatedDevice(t, fx);
    const other = await activatedDevice(t, fx);
    const response = await proofCall(t, other.device, "POST", "/runtime/v1/leases", other.activationId, {
      activation_id: d.activationId,
      instance_id: "a",
    });
    expect(response.status).toBe(401);
    expect(response.body.error.details.reason).toBe("activation_mismatch");
  });

  test("license state comes before lease state: a released lease of a revoked license hears LICENSE_REVOKED", async () => {
    const d = await activatedDevice(t, fx);
    const a = (await acquire(d, "a")).body.data;
    await release(d, a.lease_id, "a");
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    const response = await keep(d, a.lease_id, "a");
    expect(response.status).toBe(403);
    expect(response.body.error.code).toBe("LICENSE_REVOKED");
    expect(response.body.response_signature).toBeDefined();
  });

  test("a suspended or revoked license gets no seat, with a signed denial", async () => {
    const d = await activatedDevice(t, fx);
    await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body: { status_action: "suspended" } });
    const suspended = await acquire(d, "a");
    expect(suspended.body.error.code).toBe("LICENSE_SUSPENDED");
    expect(suspended.body.response_signature).toBeDefined();
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    expect((await acquire(d, "a")).body.error.code).toBe("LICENSE_REVOKED");
  });
});
