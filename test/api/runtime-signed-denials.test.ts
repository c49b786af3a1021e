import { afterAll, afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseSealingKeyLine, sealFile } from "../../src/crypto/sealed-file.ts";
import { TestDevice } from "../support/device.ts";
import { expectSignedEnvelope } from "../support/envelope.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import {
  activate,
  activatedDevice,
  heartbeatPath,
  proofCall,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";

/**
 * Protocol §16: a signed denial names whom it is for inside the signed error object. The nonce
 * alone does not bind it: a device holding any activation of the product can have the server
 * sign its own denial for a nonce it intercepted from another device's request.
 */

const dir = mkdtempSync(join(tmpdir(), "signed-denials-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { max_machines: 10, max_concurrent: 2, concurrency_unit: "instance", lease_ttl_sec: 600 },
  });
});
afterEach(() => t.close());

type Device = Awaited<ReturnType<typeof activatedDevice>>;

/** The answer is a signed denial of `code` whose signed details name `subject`. */
// biome-ignore lint/suspicious/noExplicitAny: response bodies are arbitrary JSON.
function expectNamedDenial(response: { status: number; body: any }, code: string, subject: object) {
  expect(response.body.error?.code).toBe(code);
  expect(response.body.error.details).toMatchObject(subject);
  // The signature's body hash is over the whole error object, details included.
  expectSignedEnvelope(response.body, {
    status: response.status,
    nonce: response.body.response_assertion.nonce,
    productId: fx.productId,
    bundle: fx.bundle,
  });
}

const revoke = async () =>
  expect((await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`)).status).toBe(204);

async function sealedHeaderLine(): Promise<string> {
  const created = await t.call("POST", `/mgmt/v1/products/${fx.productId}/sealed-files`);
  const input = join(dir, `in-${Math.random()}`);
  writeFileSync(input, new Uint8Array(64));
  await sealFile(input, `${input}.sealed`, parseSealingKeyLine(created.body.data.current_key.sealing_key));
  const file = new Uint8Array(readFileSync(`${input}.sealed`));
  return new TextDecoder().decode(file.subarray(9, file.indexOf(0x0a, 9)));
}

describe("every signed denial on a device-proof route names the activation it answers", () => {
  test("a heartbeat of a revoked license hears LICENSE_REVOKED naming its activation", async () => {
    const d = await activatedDevice(t, fx);
    await revoke();
    const response = await proofCall(t, d.device, "POST", heartbeatPath(d.activationId), d.activationId, {
      machine_info_digest: "0".repeat(64),
    });
    expectNamedDenial(response, "LICENSE_REVOKED", { activation_id: d.activationId });
  });

  test("a deactivation of a deactivated activation hears ACTIVATION_DEACTIVATED naming it", async () => {
    const d = await activatedDevice(t, fx);
    const path = `/runtime/v1/activations/${d.activationId}`;
    expect((await proofCall(t, d.device, "DELETE", path, d.activationId)).status).toBe(200);
    const again = await proofCall(t, d.device, "DELETE", path, d.activationId);
    expect(again.status).toBe(410);
    expectNamedDenial(again, "ACTIVATION_DEACTIVATED", { activation_id: d.activationId });
  });

  test("a lease acquire and a lease renewal of a revoked license hear LICENSE_REVOKED naming the activation", async () => {
    const d: Device = await activatedDevice(t, fx);
    const body = { activation_id: d.activationId, instance_id: "a" };
    const taken = await proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, body);
    expect(taken.status).toBe(201);
    await revoke();
    const acquire = await proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, body);
    expectNamedDenial(acquire, "LICENSE_REVOKED", { activation_id: d.activationId });
    const renew = await proofCall(
      t,
      d.device,
      "POST",
      `/runtime/v1/leases/${taken.body.data.lease_id}/heartbeat`,
      d.activationId,
      { instance_id: "a" },
    );
    expectNamedDenial(renew, "LICENSE_REVOKED", { activation_id: d.activationId });
  });

  test("a sealed-file key request of a revoked license hears LICENSE_REVOKED naming the activation", async () => {
    const d = await activatedDevice(t, fx);
    const header = await sealedHeaderLine();
    await revoke();
    const path = `/runtime/v1/activations/${d.activationId}/sealed-file-keys`;
    const response = await proofCall(t, d.device, "POST", path, d.activationId, { header });
    expectNamedDenial(response, "LICENSE_REVOKED", { activation_id: d.activationId });
  });

  test("a lease acquire of a suspended license hears LICENSE_SUSPENDED naming the activation", async () => {
    const d = await activatedDevice(t, fx);
    await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body: { status_action: "suspended" } });
    const acquire = await proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, {
      activation_id: d.activationId,
      instance_id: "a",
    });
    expectNamedDenial(acquire, "LICENSE_SUSPENDED", { activation_id: d.activationId });
  });

  test("two activations' denials for the same nonce differ in the activation they name", async () => {
    const victim = await activatedDevice(t, fx);
    const attacker = await activatedDevice(t, fx);
    await revoke();
    const nonce = "Hs5dK8fJ2lA9qW3eR7tY1uI6";
    const answer = (d: Device) =>
      proofCall(t, d.device, "POST", heartbeatPath(d.activationId), d.activationId, {
        machine_info_digest: "0".repeat(64),
      });
    const spliced = await proofCall(
      t,
      attacker.device,
      "POST",
      heartbeatPath(attacker.activationId),
      attacker.activationId,
      { machine_info_digest: "0".repeat(64) },
      { nonce },
    );
    expect(spliced.body.response_assertion.nonce).toBe(nonce);
    expect(spliced.body.error.details.activation_id).toBe(attacker.activationId);
    expect(spliced.body.error.details.activation_id).not.toBe(victim.activationId);
    expectNamedDenial(await answer(victim), "LICENSE_REVOKED", { activation_id: victim.activationId });
  });
});

describe("a signed denial of an activation request names the device key it answers", () => {
  test("an activation on a revoked license hears LICENSE_REVOKED naming the device's key thumbprint", async () => {
    await revoke();
    const device = new TestDevice("ed25519");
    const response = await activate(t, device, fx);
    expect(response.status).toBe(403);
    expectNamedDenial(response, "LICENSE_REVOKED", { device_thumbprint: device.thumbprint });
    expect(response.body.error.details.activation_id).toBeUndefined();
  });
});

describe("a license-state denial of an activation request also names the license, which the device has no other way to learn", () => {
  const toState: Record<string, () => Promise<void>> = {
    LICENSE_REVOKED: revoke,
    LICENSE_SUSPENDED: async () => {
      const body = { status_action: "suspended" };
      expect((await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body })).status).toBe(200);
    },
    LICENSE_EXPIRED: async () => {
      const body = { expires_at: new Date(t.clock.now().getTime() + 60_000).toISOString() };
      expect((await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body })).status).toBe(200);
      t.clock.advance(61);
    },
  };
  for (const [code, makeIt] of Object.entries(toState)) {
    test(`${code} answered to an activation names the license beside the device key`, async () => {
      await makeIt();
      const device = new TestDevice("ed25519");
      const response = await activate(t, device, fx);
      expect(response.status).toBe(403);
      expectNamedDenial(response, code, { device_thumbprint: device.thumbprint, license_id: fx.licenseId });
    });
  }

  test("an activation with a key of no license learns no license id", async () => {
    await revoke();
    const device = new TestDevice("ed25519");
    const response = await activate(t, device, { ...fx, licenseKey: `${fx.licenseKey.slice(0, -4)}ZZZZ` });
    expect(response.status).toBe(401);
    expect(response.body.error.code).toBe("LICENSE_KEY_INVALID");
    expect(JSON.stringify(response.body)).not.toContain(fx.licenseId);
  });

  test("a device-proof route's denial names the activation only, as before", async () => {
    const d = await activatedDevice(t, fx);
    await revoke();
    const response = await proofCall(t, d.device, "POST", heartbeatPath(d.activationId), d.activationId, {
      machine_info_digest: "0".repeat(64),
    });
    expectNamedDenial(response, "LICENSE_REVOKED", { activation_id: d.activationId });
    expect(response.body.error.details.license_id).toBeUndefined();
  });
});
