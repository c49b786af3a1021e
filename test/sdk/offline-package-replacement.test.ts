import { afterEach, beforeEach, expect, test } from "bun:test";
import { TrustService } from "../../src/modules/trust/service.ts";
import type { LicensingClient } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal, requestPackage, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * A device that holds one activation and is handed an offline package of another: after its
 * package expired, after the vendor force-deactivated its activation, or for another license. A
 * package that verifies and was issued after what the device holds replaces it; an older one (a
 * rollback) changes nothing; and the package's trust bundle is taken whatever becomes of it.
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

/** A device with no network at all. */
function airGapped(): LicensingClient {
  return sdkClient(t, config, {
    fetch: (async () => {
      throw new TypeError("air-gapped");
    }) as unknown as typeof fetch,
  });
}

async function secondLicense(): Promise<string> {
  const created = await t.call("POST", "/mgmt/v1/licenses", {
    body: { product_id: fx.productId, policy_id: fx.policyId },
    headers: t.idem(),
  });
  expect(created.status).toBe(201);
  return created.body.data.public_id;
}

async function packageFor(
  app: LicensingClient,
  licenseId = fx.licenseId,
  extra: Record<string, unknown> = {},
): Promise<Uint8Array> {
  const request = await app.createOfflineRequest({ machineInfo: MACHINE });
  const response = await requestPackage(t, licenseId, request, extra);
  if (response.status !== 200) throw new Error(`package: ${JSON.stringify(response.error)}`);
  return response.bytes;
}

test("a newer package of another license replaces the activation of one that expired", async () => {
  const app = airGapped();
  const first = await app.loadOfflinePackage(
    await packageFor(app, fx.licenseId, {
      expires_at: new Date(t.clock.now().getTime() + 60_000).toISOString(),
    }),
  );
  t.clock.advance(120);
  expect(await app.licenseInfo()).toMatchObject({ state: "invalid", licenseId: fx.licenseId });

  const other = await secondLicense();
  const loaded = await app.loadOfflinePackage(await packageFor(app, other));
  expect(loaded.activationId).not.toBe(first.activationId);
  expect(loaded.replacedActivationId).toBe(first.activationId);
  expect(await app.activationId()).toBe(loaded.activationId);
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: other });
});

test("after the vendor force-deactivates the device's activation, a new package of the same license is taken", async () => {
  const app = airGapped();
  const first = await app.loadOfflinePackage(await packageFor(app));
  const ended = await t.call("DELETE", `/mgmt/v1/activations/${first.activationId}`);
  expect(ended.status).toBeLessThan(300);
  t.clock.advance(1);

  const loaded = await app.loadOfflinePackage(await packageFor(app));
  expect(loaded.activationId).not.toBe(first.activationId);
  expect(loaded.replacedActivationId).toBe(first.activationId);
  expect(await app.licenseState()).toBe("valid");
});

test("a package of another activation older than the one held is refused as superseded and changes nothing", async () => {
  const app = airGapped();
  const other = await secondLicense();
  const older = await packageFor(app, other);
  t.clock.advance(60);
  const held = await app.loadOfflinePackage(await packageFor(app));

  const refused = await refusal(app.loadOfflinePackage(older));
  expect(refused).toMatchObject({
    code: "PACKAGE_SUPERSEDED",
    kind: "verification",
    details: { newest_answer: held.manifest.issued_at, held_activation_id: held.activationId },
  });
  expect(refused.details.issued_at).toBeLessThan(held.manifest.issued_at);
  expect(await app.activationId()).toBe(held.activationId);
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: fx.licenseId });
});

test("a package of another activation issued in the same second as the one held is refused: which is newer cannot be told", async () => {
  const app = airGapped();
  const other = await secondLicense();
  const sameSecond = await packageFor(app, other);
  const held = await app.loadOfflinePackage(await packageFor(app));
  expect((await refusal(app.loadOfflinePackage(sameSecond))).code).toBe("PACKAGE_SUPERSEDED");
  expect(await app.activationId()).toBe(held.activationId);
});

test("a package of another license made for another device replaces nothing", async () => {
  const app = airGapped();
  const held = await app.loadOfflinePackage(await packageFor(app));
  t.clock.advance(60);
  const stranger = airGapped();
  const theirs = await packageFor(stranger, await secondLicense());
  expect((await refusal(app.loadOfflinePackage(theirs))).code).toBe("PACKAGE_DEVICE_MISMATCH");
  expect(await app.activationId()).toBe(held.activationId);
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: fx.licenseId });
});

test("a replaced activation's older package does not come back once the replacing one is gone, but a later package of it is taken", async () => {
  const app = sdkClient(t, config);
  const other = await secondLicense();
  const oldPackage = await packageFor(app);
  const first = await app.loadOfflinePackage(oldPackage);
  t.clock.advance(60);
  const second = await app.loadOfflinePackage(await packageFor(app, other));
  expect(second.replacedActivationId).toBe(first.activationId);

  t.clock.advance(60);
  expect((await refusal(app.loadOfflinePackage(oldPackage))).code).toBe("PACKAGE_SUPERSEDED");
  // The hybrid device goes online and gives the second license's slot back.
  await app.deactivate();
  expect(await app.activationId()).toBeUndefined();
  t.clock.advance(60);
  const refused = await refusal(app.loadOfflinePackage(oldPackage));
  expect(refused).toMatchObject({
    code: "PACKAGE_SUPERSEDED",
    details: { activation_id: first.activationId, newest_answer: second.manifest.issued_at },
  });
  expect(await app.activationId()).toBeUndefined();

  // The first activation still holds its slot on the service, which hands it out again.
  const again = await app.loadOfflinePackage(await packageFor(app));
  expect(again.activationId).toBe(first.activationId);
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: fx.licenseId });
});

test("a newer package delivers the bundle without a retired key: the device moves on to it, and the old package no longer verifies", async () => {
  const app = airGapped();
  const oldPackage = await packageFor(app);
  await app.loadOfflinePackage(oldPackage);
  t.clock.advance(60);
  expect((await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`)).status).toBeLessThan(300);
  const trust = new TrustService(t.deps);
  const oldKey = fx.bundle.signing_keys[0]?.key_id as string;
  trust.rotate(fx.productId);
  trust.retire(oldKey);
  t.clock.advance(60);

  const other = await secondLicense();
  await app.loadOfflinePackage(await packageFor(app, other));
  const bundle = await app.trustBundle();
  expect(bundle.signing_keys.some((key) => key.key_id === oldKey)).toBe(false);
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: other });
  // Its manifest.sig names a key the bundle no longer lists.
  expect((await refusal(app.loadOfflinePackage(oldPackage))).code).toBe("PACKAGE_SIGNATURE_INVALID");
  expect(await app.licenseInfo()).toMatchObject({ state: "valid", licenseId: other });
});

test("a package refused as expired still hands over its newer trust bundle", async () => {
  const app = airGapped();
  await app.loadOfflinePackage(await packageFor(app));
  const held = (await app.trustBundle()).sequence;
  new TrustService(t.deps).rotate(fx.productId);
  t.clock.advance(60);
  const shortLived = await packageFor(app, fx.licenseId, {
    expires_at: new Date(t.clock.now().getTime() + 60_000).toISOString(),
  });
  t.clock.advance(120);
  expect((await refusal(app.loadOfflinePackage(shortLived))).code).toBe("PACKAGE_EXPIRED");
  expect((await app.trustBundle()).sequence).toBe(held + 1);
});
