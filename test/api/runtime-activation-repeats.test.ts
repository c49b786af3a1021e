import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { TestDevice } from "../support/device.ts";
import { expectSignedEnvelope } from "../support/envelope.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { activate, nowSec, type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * A device activating again: replays of an Idempotency-Key, repeats of a captured request, and a
 * known device binding itself again (its baseline, signals and keys).
 */
let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, { policy: { max_machines: 2, entitlements: { export: true } } });
});
afterEach(() => t.close());

const activations = () =>
  (t.deps.sqlite.query("SELECT count(*) AS n FROM activations").get() as { n: number }).n;

describe("replays and repeats", () => {
  test("a replayed activation after the license was revoked answers the signed denial, not the stored 201", async () => {
    const device = new TestDevice();
    expect((await activate(t, device, fx, { idempotencyKey: "activation-replay-0001" })).status).toBe(201);
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    const replay = await activate(t, device, fx, { idempotencyKey: "activation-replay-0001" });
    expect(replay.status).toBe(403);
    expect(replay.body.error.code).toBe("LICENSE_REVOKED");
    expect(replay.body.response_signature).toBeDefined();
  });

  test("a captured activation request sent again under a new Idempotency-Key is a replay (401)", async () => {
    const device = new TestDevice();
    const body = device.activationBody({
      licenseKey: fx.licenseKey,
      productId: fx.productId,
      clientTime: nowSec(t),
    });
    const first = await t.call("POST", "/runtime/v1/activations", { key: null, body, headers: t.idem() });
    expect(first.status).toBe(201);
    await t.call("DELETE", `/mgmt/v1/activations/${first.body.data.activation_id}`);
    const replay = await t.call("POST", "/runtime/v1/activations", { key: null, body, headers: t.idem() });
    expect(replay.status).toBe(401);
    expect(replay.body.error).toMatchObject({
      code: "DEVICE_PROOF_INVALID",
      details: { reason: "replayed" },
    });
    expect(activations()).toBe(1);
  });

  test("an idempotent replay after the activation was deactivated answers a signed 410, not the stored 201", async () => {
    const device = new TestDevice();
    const first = await activate(t, device, fx, { idempotencyKey: "activation-replay-0002" });
    await t.call("DELETE", `/mgmt/v1/activations/${first.body.data.activation_id}`);
    const replay = await activate(t, device, fx, { idempotencyKey: "activation-replay-0002" });
    expect(replay.status).toBe(410);
    expect(replay.body.error.code).toBe("ACTIVATION_DEACTIVATED");
    expectSignedEnvelope(replay.body, {
      status: 410,
      nonce: replay.body.response_assertion.nonce,
      productId: fx.productId,
      bundle: fx.bundle,
    });
  });

  test("activating again refreshes the machine baseline and check-in of the existing activation", async () => {
    const device = new TestDevice();
    const first = await activate(t, device, fx);
    t.clock.advance(3600);
    const moved = { os: "linux", arch: "arm64" };
    const again = await activate(t, device, fx, { body: { machine_info: moved } });
    expect(again.body.data.activation_id).toBe(first.body.data.activation_id);
    expect(again.body.data.machine_info_digest).not.toBe(first.body.data.machine_info_digest);
    const seen = (await t.call("GET", `/mgmt/v1/activations/${first.body.data.activation_id}`)).body.data;
    expect(seen.machine.info).toEqual(moved);
    // The test clock runs with real time too; the check-in is "now", to within the test's run time.
    expect(Math.abs(new Date(seen.last_heartbeat_at).getTime() - t.clock.now().getTime())).toBeLessThan(2000);
    expect(new Date(seen.last_heartbeat_at).getTime()).toBeGreaterThan(
      new Date(seen.activated_at).getTime() + 3_000_000,
    );
  });

  test("activating again replaces the machine_signals with those sent, and keeps them when none are sent", async () => {
    const device = new TestDevice();
    const first = await activate(t, device, fx);
    const id = first.body.data.activation_id;
    const signals = async () => (await t.call("GET", `/mgmt/v1/activations/${id}`)).body.data.machine.signals;
    expect(await signals()).toEqual({ hostname: "test-host" });
    const renamed = await activate(t, device, fx, { body: { machine_signals: { hostname: "renamed" } } });
    expect(renamed.body.data.activation_id).toBe(id);
    expect(await signals()).toEqual({ hostname: "renamed" });
    const without = await activate(t, device, fx, { body: { machine_signals: undefined } });
    expect(without.status).toBe(201);
    expect(await signals()).toEqual({ hostname: "renamed" });
  });

  test("activating again with another KEM key is an unsigned 409 DEVICE_KEY_MISMATCH naming the activation; nothing changes and nothing is stored for the key", async () => {
    const device = new TestDevice();
    const first = await activate(t, device, fx);
    const id = first.body.data.activation_id;
    const rebuiltKem = new TestDevice().kemPublic;
    const storedKem = () =>
      t.deps.sqlite
        .query<{ k: string; info: string }, [string]>(
          "SELECT device_kem_key AS k, machine_info AS info FROM activations WHERE id = ?",
        )
        .get(id);
    const before = storedKem();
    const request = {
      idempotencyKey: "activation-kem-mismatch-1",
      body: { device_kem_public_key: rebuiltKem, machine_info: { os: "linux", arch: "arm64" } },
    };
    for (const attempt of [1, 2]) {
      const refused = await activate(t, device, fx, request);
      expect({ attempt, status: refused.status }).toEqual({ attempt, status: 409 });
      expect(refused.headers.get("idempotent-replayed")).toBeNull();
      expect(refused.body.error).toMatchObject({
        code: "DEVICE_KEY_MISMATCH",
        details: { activation_id: id },
      });
      // Unsigned like every refusal outside protocol §16: it proves nothing to the device.
      expect(refused.body.response_signature).toBeUndefined();
    }
    expect(storedKem()).toEqual(before);
    expect(before?.k).toBe(device.kemPublic);
    expect(activations()).toBe(1);
    // After deactivating, the same request under the same key is a new activation with the new KEM key.
    await t.call("DELETE", `/mgmt/v1/activations/${id}`);
    const fresh = await activate(t, device, fx, request);
    expect(fresh.status).toBe(201);
    expect(fresh.body.data.activation_id).not.toBe(id);
    expect(
      t.deps.sqlite
        .query<{ k: string }, [string]>("SELECT device_kem_key AS k FROM activations WHERE id = ?")
        .get(fresh.body.data.activation_id)?.k,
    ).toBe(rebuiltKem);
  });

  test("machine_info takes integers, not fractions (the body is signed as JCS)", async () => {
    const response = await activate(t, new TestDevice(), fx, {
      body: { machine_info: { os: "linux", arch: "x64", cores: 2.5 } },
    });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors).toEqual({ "machine_info.cores": ["Expected integer"] });
  });

  test("a machine_info fact too long is told its limit, not which types a fact may have", async () => {
    const response = await activate(t, new TestDevice(), fx, {
      body: { machine_info: { os: "linux", arch: "x64", hostname: "h".repeat(257) } },
    });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors).toEqual({
      "machine_info.hostname": ["Expected string length less or equal to 256"],
    });
  });
});
