import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import type { LicensingClient } from "../../src/sdk/index.ts";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, sdkClient } from "../support/offline.ts";
import {
  activate,
  heartbeatPath,
  proofCall,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";

/**
 * Splices through the in-process server: an attacker who intercepts a device's request and holds
 * another activation of the same product sends the victim's nonce on its own activation, and hands
 * the victim the correctly signed answer. The nonce, status and product all match; only the
 * activation the answer names does not. Denials (protocol §16): the attacker's revoked or
 * deactivated activation would revoke or end the victim's. Leases (§14): the attacker's seat would
 * read as one the victim holds, so one seat would serve any number of devices.
 */

let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { license_type: "subscription", max_machines: 5, max_concurrent: 1 },
  });
});
afterEach(() => t.close());

/**
 * The attacker's own activation: on a second license of the product (a trial would do), or with
 * `onVictimsLicense` on the victim's license, as a user with two machines and one floating seat.
 */
async function attackerActivation(onVictimsLicense = false) {
  const license = onVictimsLicense
    ? { key: fx.licenseKey, public_id: fx.licenseId }
    : (
        await t.call("POST", "/mgmt/v1/licenses", {
          body: { product_id: fx.productId, policy_id: fx.policyId },
          headers: t.idem(),
        })
      ).body.data;
  const device = new TestDevice("ed25519");
  const created = await activate(t, device, { licenseKey: license.key, productId: fx.productId });
  expect(created.status).toBe(201);
  return {
    device,
    activationId: created.body.data.activation_id as string,
    licenseId: license.public_id as string,
  };
}

type Attacker = Awaited<ReturnType<typeof attackerActivation>>;

/**
 * The victim's SDK behind a man in the middle: while `splicing` is set, a request to a path
 * containing `on` is answered by the attacker's own call (made with the victim's nonce).
 */
async function victimBehind(
  on: string,
  spliced: (attacker: Attacker, nonce: string) => Promise<{ status: number; text: string; headers: Headers }>,
  attacker: Attacker,
) {
  const mitm = { splicing: false, answered: [] as number[] };
  const fetch = async (url: string, init?: RequestInit): Promise<Response> => {
    if (mitm.splicing && new URL(url).pathname.includes(on)) {
      const headers = new Headers(init?.headers);
      const nonce = headers.get("x-service-nonce") ?? JSON.parse(String(init?.body)).nonce;
      const r = await spliced(attacker, nonce);
      mitm.answered.push(r.status);
      return new Response(r.text, { status: r.status, headers: r.headers });
    }
    return t.app.handle(new Request(url, init));
  };
  const victim: LicensingClient = sdkClient(t, await integrationConfig(t, fx.productId), {
    fetch: fetch as typeof globalThis.fetch,
  });
  await victim.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  return { victim, mitm };
}

const attackerHeartbeat = (a: Attacker, nonce: string) =>
  proofCall(
    t,
    a.device,
    "POST",
    heartbeatPath(a.activationId),
    a.activationId,
    { machine_info_digest: "0".repeat(64) },
    { nonce },
  );
const attackerDeactivation = (a: Attacker, nonce: string) =>
  proofCall(t, a.device, "DELETE", `/runtime/v1/activations/${a.activationId}`, a.activationId, undefined, {
    nonce,
  });

describe("a victim handed another activation's signed denial for its own nonce", () => {
  test("keeps its activation and its valid license when the denial is LICENSE_REVOKED", async () => {
    const attacker = await attackerActivation();
    expect((await t.call("DELETE", `/mgmt/v1/licenses/${attacker.licenseId}`)).status).toBe(204);
    const { victim, mitm } = await victimBehind("/heartbeat", attackerHeartbeat, attacker);
    const own = await victim.activationId();
    mitm.splicing = true;
    const refused = await victim.heartbeat().then(
      () => undefined,
      (e) => e,
    );
    expect(mitm.answered).toEqual([403]);
    expect(refused).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification", authentic: false });
    expect(await victim.activationId()).toBe(own);
    expect(await victim.licenseInfo()).toMatchObject({ state: "valid" });
    mitm.splicing = false;
    expect((await victim.heartbeat()).activationId).toBe(own as string);
  });

  test("keeps its activation when the denial is ACTIVATION_DEACTIVATED", async () => {
    const attacker = await attackerActivation();
    expect((await attackerDeactivation(attacker, "a".repeat(22))).status).toBe(200);
    const { victim, mitm } = await victimBehind("/heartbeat", attackerDeactivation, attacker);
    const own = await victim.activationId();
    mitm.splicing = true;
    const refused = await victim.heartbeat().then(
      () => undefined,
      (e) => e,
    );
    expect(mitm.answered).toEqual([410]);
    expect(refused).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification" });
    expect(await victim.activationId()).toBe(own);
    expect(await victim.licenseInfo()).toMatchObject({ state: "valid" });
  });

  test("does not take its own deactivation as done when the denial is another's ACTIVATION_DEACTIVATED", async () => {
    const attacker = await attackerActivation();
    expect((await attackerDeactivation(attacker, "b".repeat(22))).status).toBe(200);
    const { victim, mitm } = await victimBehind(
      "/runtime/v1/activations/act_",
      attackerDeactivation,
      attacker,
    );
    const own = await victim.activationId();
    mitm.splicing = true;
    const refused = await victim.deactivate().then(
      () => undefined,
      (e) => e,
    );
    expect(mitm.answered).toEqual([410]);
    expect(refused).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification" });
    expect(await victim.activationId()).toBe(own);
  });

  test("still acts on its own signed denial", async () => {
    const attacker = await attackerActivation();
    const { victim } = await victimBehind("/never", attackerHeartbeat, attacker);
    expect((await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`)).status).toBe(204);
    const refused = await victim.heartbeat().then(
      () => undefined,
      (e) => e,
    );
    expect(refused).toMatchObject({ code: "LICENSE_REVOKED", kind: "license", authentic: true });
    expect(await victim.licenseInfo()).toMatchObject({ state: "invalid", reason: "revoked" });
  });
});

const INSTANCE = "main-window";
const attackerAcquire = (a: Attacker, nonce: string) =>
  proofCall(
    t,
    a.device,
    "POST",
    "/runtime/v1/leases",
    a.activationId,
    { activation_id: a.activationId, instance_id: INSTANCE },
    { nonce },
  );

describe("a device handed another activation's lease for its own nonce", () => {
  test("does not take the attacker's seat as its own when acquiring (the license's one seat stays one device's)", async () => {
    const attacker = await attackerActivation(true);
    expect((await attackerAcquire(attacker, "c".repeat(22))).status).toBe(201);
    const { victim, mitm } = await victimBehind("/runtime/v1/leases", attackerAcquire, attacker);
    mitm.splicing = true;
    const refused = await victim.acquireLease(INSTANCE).then(
      () => undefined,
      (e) => e,
    );
    expect(mitm.answered).toEqual([201]);
    expect(refused).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification" });
    mitm.splicing = false;
    // Unspliced, the seat is still the attacker's: the victim is refused, not granted.
    const own = await victim.acquireLease(INSTANCE).then(
      () => undefined,
      (e) => e,
    );
    expect(own).toMatchObject({ code: "CONCURRENCY_LIMIT_REACHED" });
  });

  test("does not take the attacker's renewal of the same lease id as its own", async () => {
    const attacker = await attackerActivation(true);
    const taken = await attackerAcquire(attacker, "d".repeat(22));
    expect(taken.status).toBe(201);
    const leaseId = taken.body.data.lease_id as string;
    const renew = (a: Attacker, nonce: string) =>
      proofCall(
        t,
        a.device,
        "POST",
        `/runtime/v1/leases/${leaseId}/heartbeat`,
        a.activationId,
        { instance_id: INSTANCE },
        { nonce },
      );
    const { victim, mitm } = await victimBehind("/runtime/v1/leases", renew, attacker);
    mitm.splicing = true;
    const refused = await victim.heartbeatLease(leaseId, INSTANCE).then(
      () => undefined,
      (e) => e,
    );
    expect(mitm.answered).toEqual([200]);
    expect(refused).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification" });
  });

  test("still reads its own leases, which name its activation", async () => {
    const { victim } = await victimBehind("/never", attackerAcquire, await attackerActivation());
    const lease = await victim.acquireLease(INSTANCE);
    expect((await victim.heartbeatLease(lease.leaseId, INSTANCE)).leaseId).toBe(lease.leaseId);
    expect(await victim.releaseLease(lease.leaseId, INSTANCE)).toEqual({
      leaseId: lease.leaseId,
      status: "released",
    });
  });
});
