import { afterEach, beforeEach, expect, test } from "bun:test";
import { type LicensingClient, MemoryStorage } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal, requestPackage, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * A signed denial of the license itself (revoked, expired, suspended) is the newer word over
 * every offline package of that license issued before it: whichever activation the package is
 * for (the vendor may have made a new one after force-deactivating the device's), and whether or
 * not the device still holds the activation the denial named. A package of another license is
 * weighed against the held activation's denial as against its other answers.
 */
let t: TestContext;
let fx: RuntimeFixture;
let config: Record<string, unknown>;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { validation_mode: "hybrid", max_machines: 2, entitlements: { pro: true } },
    license: { expires_at: new Date(t.clock.now().getTime() + 90 * 86_400_000).toISOString() },
  });
  config = await integrationConfig(t, fx.productId);
});
afterEach(() => t.close());

const PREFIX = () => `svc.v1.live.${fx.productId}.`;

async function packageFor(app: LicensingClient, licenseId = fx.licenseId): Promise<Uint8Array> {
  const request = await app.createOfflineRequest({ machineInfo: MACHINE });
  const response = await requestPackage(t, licenseId, request);
  if (response.status !== 200) throw new Error(`package: ${JSON.stringify(response.error)}`);
  return response.bytes;
}

async function mgmt(method: string, path: string, body?: Record<string, unknown>): Promise<void> {
  const response = await t.call(method, path, body === undefined ? {} : { body });
  expect(response.status).toBeLessThan(300);
}

/**
 * An activated device whose activation the vendor then force-deactivated, holding a package of a
 * new activation of the same license made after that; then the license is revoked and the device
 * hears it from a heartbeat of its (deactivated) activation, the license state answered first.
 */
async function deviceThatHeardRevocation() {
  const app = sdkClient(t, config);
  const first = await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  await mgmt("DELETE", `/mgmt/v1/activations/${first.activationId}`);
  t.clock.advance(10);
  const before = await packageFor(app);
  t.clock.advance(60);
  await mgmt("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
  t.clock.advance(10);
  const heard = await refusal(app.heartbeat());
  expect(heard).toMatchObject({ kind: "license", code: "LICENSE_REVOKED" });
  return { app, first, before, revokedAt: heard.details.server_time as number };
}

test("a package of another activation of a revoked license, issued before the revocation the device holds, is refused with the revocation and changes nothing", async () => {
  const { app, first, before, revokedAt } = await deviceThatHeardRevocation();
  const error = await refusal(app.loadOfflinePackage(before));
  expect(error).toMatchObject({ kind: "license", code: "LICENSE_REVOKED" });
  expect(error.details).toMatchObject({ server_time: revokedAt, signed: true });
  expect(error.details.overtaken_server_time).toBeLessThan(revokedAt);
  expect(await app.activationId()).toBe(first.activationId);
  expect(await app.licenseInfo()).toMatchObject({ state: "invalid" });
});

test("after deactivate() clears the revoked activation, the older package of the license is still refused", async () => {
  const { app, before } = await deviceThatHeardRevocation();
  // The service answers the deactivated activation's DELETE with its signed 410: that ends it here.
  await app.deactivate();
  expect(await app.activationId()).toBeUndefined();
  expect(await refusal(app.loadOfflinePackage(before))).toMatchObject({
    kind: "license",
    code: "LICENSE_REVOKED",
  });
  expect(await app.activationId()).toBeUndefined();
  expect(await app.licenseState()).toBe("invalid");
});

test("a suspension the device heard stands against the license's older packages even after reinstatement, while a package issued after it is taken", async () => {
  const app = sdkClient(t, config);
  // A package of one activation, not loaded; the vendor deactivates that activation, and the
  // device activates online instead: a second activation of the same license.
  const before = await packageFor(app);
  const [{ id: packaged }] = (await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}/activations`)).body.data;
  await mgmt("DELETE", `/mgmt/v1/activations/${packaged}`);
  t.clock.advance(10);
  await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  t.clock.advance(60);
  await mgmt("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { status_action: "suspended" });
  t.clock.advance(10);
  // A heartbeat reports a suspension as license_status; a seat request is refused with it, signed.
  expect(await refusal(app.acquireLease("instance-1"))).toMatchObject({
    kind: "license",
    code: "LICENSE_SUSPENDED",
  });
  await app.deactivate();
  expect((await refusal(app.loadOfflinePackage(before))).code).toBe("LICENSE_SUSPENDED");

  await mgmt("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { status_action: "active" });
  t.clock.advance(10);
  // The device cannot tell a reinstatement from here: only a package issued after the denial counts.
  expect((await refusal(app.loadOfflinePackage(before))).code).toBe("LICENSE_SUSPENDED");
  await app.loadOfflinePackage(await packageFor(app));
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: fx.licenseId });
});

/**
 * A device that heard from a heartbeat, as a heartbeat reports it (a signed 200, license_status
 * "suspended"), that the license is suspended; holding a package, issued before, of an activation
 * of the license the vendor ended since.
 */
async function deviceThatHeardSuspensionFromHeartbeat(app: LicensingClient) {
  const before = await packageFor(app);
  const [{ id: packaged }] = (await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}/activations`)).body.data;
  await mgmt("DELETE", `/mgmt/v1/activations/${packaged}`);
  t.clock.advance(10);
  await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  t.clock.advance(60);
  await mgmt("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { status_action: "suspended" });
  t.clock.advance(10);
  const heard = await app.heartbeat();
  expect(heard.licenseStatus).toBe("suspended");
  return { before, heard };
}

test("a suspension a heartbeat reported stands against the license's older packages after deactivate(), as a LICENSE_SUSPENDED denial would", async () => {
  const app = sdkClient(t, config);
  const { before, heard } = await deviceThatHeardSuspensionFromHeartbeat(app);
  await app.deactivate();
  const error = await refusal(app.loadOfflinePackage(before));
  expect(error).toMatchObject({ kind: "license", code: "LICENSE_SUSPENDED" });
  expect(error.details).toMatchObject({
    server_time: heard.serverTime,
    license_status: "suspended",
    signed: true,
  });
  expect(error.details.overtaken_server_time).toBeLessThan(heard.serverTime);
  expect(await app.activationId()).toBeUndefined();
  expect(await app.hasEntitlement("pro")).toBe(false);

  // Reinstated: a package issued after the suspension is taken; the older one still is not.
  await mgmt("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { status_action: "active" });
  t.clock.advance(10);
  expect((await refusal(app.loadOfflinePackage(before))).code).toBe("LICENSE_SUSPENDED");
  await app.loadOfflinePackage(await packageFor(app));
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: fx.licenseId });
});

test("a heartbeat of an active license remembers no denial: after deactivate(), a package of the license issued before it still loads", async () => {
  const storage = new MemoryStorage();
  const app = sdkClient(t, config, { storage });
  const before = await packageFor(app);
  // The vendor ends the packaged activation, so that activate() makes a new one for these keys.
  const [{ id: packaged }] = (await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}/activations`)).body.data;
  await mgmt("DELETE", `/mgmt/v1/activations/${packaged}`);
  t.clock.advance(10);
  await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  t.clock.advance(60);
  expect((await app.heartbeat()).licenseStatus).toBe("active");
  await app.deactivate();
  expect(await storage.get(`${PREFIX()}license_denials`)).toBeUndefined();
  expect((await app.loadOfflinePackage(before)).activationId).toBe(packaged);
  expect(await app.licenseState()).toBe("valid");
});

test("a revocation answered to activate() is remembered by the license it names: a package issued before it is refused", async () => {
  const storage = new MemoryStorage();
  const app = sdkClient(t, config, { storage });
  const before = await packageFor(app);
  t.clock.advance(60);
  await mgmt("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
  t.clock.advance(10);
  const denied = await refusal(app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE }));
  expect(denied).toMatchObject({ kind: "license", code: "LICENSE_REVOKED" });
  expect(denied.details.license_id).toBe(fx.licenseId);

  const error = await refusal(app.loadOfflinePackage(before));
  expect(error).toMatchObject({ kind: "license", code: "LICENSE_REVOKED" });
  expect(error.details).toMatchObject({ server_time: denied.details.server_time, license_id: fx.licenseId });
  expect(await app.activationId()).toBeUndefined();
  expect(await app.licenseState()).toBe("invalid");
  // Remembered for that license only.
  const remembered = JSON.parse((await storage.get(`${PREFIX()}license_denials`)) ?? "{}").entries;
  expect(remembered.map((entry: { license_id: string }) => entry.license_id)).toEqual([fx.licenseId]);
});

test("a suspension answered to activate() refuses the license's older packages; once reinstated, a package issued after it is taken", async () => {
  const app = sdkClient(t, config);
  const before = await packageFor(app);
  t.clock.advance(60);
  await mgmt("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { status_action: "suspended" });
  t.clock.advance(10);
  const denied = await refusal(app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE }));
  expect(denied).toMatchObject({ kind: "license", code: "LICENSE_SUSPENDED" });
  expect((await refusal(app.loadOfflinePackage(before))).code).toBe("LICENSE_SUSPENDED");
  await mgmt("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { status_action: "active" });
  t.clock.advance(10);
  await app.loadOfflinePackage(await packageFor(app));
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: fx.licenseId });
});

test("a remembered denial list that cannot be read counts as none instead of failing every package", async () => {
  const storage = new MemoryStorage();
  const app = sdkClient(t, config, { storage });
  const pkg = await packageFor(app);
  await storage.set(
    `${PREFIX()}license_denials`,
    '{"entries":[{"license_id":1},"x",{"license_id":"lic_x","denial":{}}',
  );
  await app.loadOfflinePackage(pkg);
  expect(await app.licenseState()).toBe("valid");
  await storage.set(
    `${PREFIX()}license_denials`,
    '{"entries":[{"license_id":1},"x",{"license_id":"lic_x","denial":{}}]}',
  );
  await app.loadOfflinePackage(pkg);
  expect(await app.licenseState()).toBe("valid");
});

test("a package of another license issued before the held activation's signed denial is a rollback, refused as superseded", async () => {
  const app = sdkClient(t, config);
  const held = await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  t.clock.advance(10);
  const created = await t.call("POST", "/mgmt/v1/licenses", {
    body: { product_id: fx.productId, policy_id: fx.policyId },
    headers: t.idem(),
  });
  expect(created.status).toBe(201);
  const otherLicense = created.body.data.public_id as string;
  const older = await packageFor(app, otherLicense);
  t.clock.advance(60);
  await mgmt("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
  t.clock.advance(10);
  const heard = await refusal(app.heartbeat());
  expect(heard.code).toBe("LICENSE_REVOKED");

  const error = await refusal(app.loadOfflinePackage(older));
  expect(error).toMatchObject({ kind: "verification", code: "PACKAGE_SUPERSEDED" });
  expect(error.details).toMatchObject({
    newest_answer: heard.details.server_time,
    held_activation_id: held.activationId,
  });
  expect(await app.activationId()).toBe(held.activationId);
  expect(await app.licenseState()).toBe("invalid");
  // Issued after the denial, a package of the other license is the newer word and replaces it.
  t.clock.advance(10);
  const newer = await app.loadOfflinePackage(await packageFor(app, otherLicense));
  expect(newer.replacedActivationId).toBe(held.activationId);
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: otherLicense });
});
