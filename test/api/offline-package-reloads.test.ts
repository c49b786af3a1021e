import { afterEach, beforeEach, expect, test } from "bun:test";
import { LicensingClient, MemoryStorage } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal, requestPackage, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * An offline package the device already had, loaded again later: on a hybrid device that has
 * since heard newer signed state, after the device ended the package's activation, and with the
 * clock set back to before the package expired. None of them may bring back what the device knows
 * to be over; each is refused by name and changes nothing stored.
 */
let t: TestContext;
let fx: RuntimeFixture;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { validation_mode: "hybrid", max_machines: 1, entitlements: { pro: true } },
    license: { expires_at: new Date(t.clock.now().getTime() + 90 * 86_400_000).toISOString() },
  });
});
afterEach(() => t.close());

async function packageFor(app: LicensingClient, machineInfo = MACHINE): Promise<Uint8Array> {
  const response = await requestPackage(t, fx.licenseId, await app.createOfflineRequest({ machineInfo }));
  if (response.status !== 200) throw new Error(`package: ${JSON.stringify(response.error)}`);
  return response.bytes;
}

const setStatus = (status_action: string) =>
  t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body: { status_action } });

test("a package older than a heartbeat that reported a suspension is refused with that suspension, which stands", async () => {
  const app = sdkClient(t, await integrationConfig(t, fx.productId));
  const old = await packageFor(app);
  await app.loadOfflinePackage(old);
  t.clock.advance(60);
  expect((await setStatus("suspended")).status).toBe(200);
  // A heartbeat says suspended with a 200 and a certificate to match, not with a signed denial.
  expect((await app.heartbeat()).licenseStatus).toBe("suspended");
  expect(await app.licenseInfo()).toMatchObject({ state: "invalid", reason: "suspended" });

  t.clock.advance(60);
  const reloaded = await refusal(app.loadOfflinePackage(old));
  // Remembered by license as a signed LICENSE_SUSPENDED at the heartbeat's second (docs/sdk.md).
  expect(reloaded).toMatchObject({ code: "LICENSE_SUSPENDED", kind: "license" });
  expect(reloaded.details.overtaken_server_time).toBeLessThan(reloaded.details.server_time as number);
  expect(await app.licenseInfo()).toMatchObject({ state: "invalid", reason: "suspended" });
  expect(await app.hasEntitlement("pro")).toBe(false);

  // A package issued after the license is reinstated is the newer word again.
  expect((await setStatus("active")).status).toBe(200);
  t.clock.advance(60);
  await app.loadOfflinePackage(await packageFor(app));
  expect(await app.licenseState()).toBe("valid");
});

test("a hybrid device that heartbeat after its package was made still takes it when the terms are the same, and keeps the longer-lived certificate", async () => {
  const app = sdkClient(t, await integrationConfig(t, fx.productId));
  await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  // The package goes to the device's active activation; a heartbeat runs before the file arrives.
  const bytes = await packageFor(app);
  t.clock.advance(60);
  const heartbeat = await app.heartbeat();
  t.clock.advance(60);
  const loaded = await app.loadOfflinePackage(bytes);
  expect(await app.activationId()).toBe(loaded.activationId);
  const info = await app.licenseInfo();
  expect(info.state).toBe("valid");
  // The package's certificate (90 days) replaced the heartbeat's (the policy's certificate life).
  expect(info.expiresAt).toBe(loaded.expiresAt);
  expect(loaded.expiresAt).toBeGreaterThan(heartbeat.certificate.exp);
  // Loaded again later, with the heartbeat's certificate gone, the same: nothing to take back.
  t.clock.advance(60);
  await app.loadOfflinePackage(bytes);
  expect((await app.licenseInfo()).expiresAt).toBe(loaded.expiresAt);
});

test("a package older than a change of entitlements the device heard of is refused as superseded", async () => {
  const app = sdkClient(t, await integrationConfig(t, fx.productId));
  const bytes = await packageFor(app);
  await app.loadOfflinePackage(bytes);
  t.clock.advance(60);
  const changed = await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, {
    body: { entitlements: { pro: false } },
  });
  expect(changed.status).toBe(200);
  await app.heartbeat();
  expect(await app.hasEntitlement("pro")).toBe(false);
  t.clock.advance(60);
  expect((await refusal(app.loadOfflinePackage(bytes))).code).toBe("PACKAGE_SUPERSEDED");
  expect(await app.hasEntitlement("pro")).toBe(false);
});

test("the same package loaded twice, with nothing newer in between, is taken both times", async () => {
  const app = sdkClient(t, await integrationConfig(t, fx.productId));
  const bytes = await packageFor(app);
  await app.loadOfflinePackage(bytes);
  t.clock.advance(3600);
  await app.loadOfflinePackage(bytes);
  expect(await app.licenseState()).toBe("valid");
});

test("a package of an activation this device deactivated is refused, and the slot stays with the device that took it", async () => {
  const config = await integrationConfig(t, fx.productId);
  const first = sdkClient(t, config);
  const bytes = await packageFor(first);
  const loaded = await first.loadOfflinePackage(bytes);
  t.clock.advance(60);
  await first.deactivate();

  const second = sdkClient(t, config);
  await second.activate({ licenseKey: fx.licenseKey, machineInfo: { ...MACHINE, hostname: "second" } });
  t.clock.advance(60);
  const reloaded = await refusal(first.loadOfflinePackage(bytes));
  expect(reloaded).toMatchObject({
    code: "PACKAGE_ACTIVATION_ENDED",
    kind: "verification",
    details: { activation_id: loaded.activationId },
  });
  expect(await first.activationId()).toBeUndefined();
  expect(await first.licenseState()).toBe("invalid");
  expect(await second.licenseState()).toBe("valid");
  // A new package (a new activation, once the slot is free again) is taken as usual.
  await second.deactivate();
  await first.loadOfflinePackage(await packageFor(first));
  expect(await first.licenseState()).toBe("valid");
});

test("a read of the ended activations that fails is not taken for none: the package is refused with STORAGE_UNAVAILABLE", async () => {
  let failReads = false;
  const storage = new (class extends MemoryStorage {
    override async get(key: string) {
      if (failReads && key.endsWith(".ended_activations")) throw new Error("EBUSY: the file is locked");
      return super.get(key);
    }
  })();
  const app = sdkClient(t, await integrationConfig(t, fx.productId), { storage });
  const bytes = await packageFor(app);
  await app.loadOfflinePackage(bytes);
  t.clock.advance(60);
  await app.deactivate();
  failReads = true;
  expect(await refusal(app.loadOfflinePackage(bytes))).toMatchObject({
    code: "STORAGE_UNAVAILABLE",
    kind: "storage",
  });
  expect(await app.activationId()).toBeUndefined();
});

test("a package past its expiry by a verified time the device has seen is refused, even with the clock set back", async () => {
  const deviceClock = { ms: t.clock.now().getTime() };
  const app = new LicensingClient({
    config: await integrationConfig(t, fx.productId),
    fetch: ((url: string, init?: RequestInit) => t.app.handle(new Request(url, init))) as never,
    now: () => deviceClock.ms,
    storage: new MemoryStorage(),
  });
  const request = await app.createOfflineRequest({ machineInfo: MACHINE });
  const expiresAt = new Date(t.clock.now().getTime() + 86_400_000).toISOString();
  const response = await requestPackage(t, fx.licenseId, request, { expires_at: expiresAt });
  expect(response.status).toBe(200);
  // Two days on, the device hears the server's time, then its clock is set back a day and a half.
  t.clock.advance(2 * 86_400);
  deviceClock.ms = t.clock.now().getTime();
  await app.serverTime();
  deviceClock.ms -= 1.5 * 86_400_000;
  const refused = await refusal(app.loadOfflinePackage(response.bytes));
  expect(refused).toMatchObject({ code: "PACKAGE_EXPIRED", kind: "verification" });
  expect(await app.activationId()).toBeUndefined();
});
