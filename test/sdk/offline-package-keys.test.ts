import { afterEach, beforeEach, expect, test } from "bun:test";
import { exportDeviceKeys, generateDeviceKeys, LicensingClient, MemoryStorage } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal, requestPackage } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * A package loaded as the device's activation is bound to the stored device keys, as an online
 * activation is: the app clearing storage, or another client on it (a tab) replacing the keys,
 * while the package is being loaded must not leave an activation next to keys that never made it.
 */
let t: TestContext;
let fx: RuntimeFixture;
let config: Record<string, unknown>;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { validation_mode: "hybrid", max_machines: 2 },
    license: { expires_at: new Date(t.clock.now().getTime() + 90 * 86_400_000).toISOString() },
  });
  config = await integrationConfig(t, fx.productId);
});
afterEach(() => t.close());

/** Storage that runs `hook` once, just before the package's issue time is written (mid-load). */
class MidLoadStorage extends MemoryStorage {
  hook: (() => Promise<void>) | undefined;
  override async set(key: string, value: string): Promise<void> {
    const hook = this.hook;
    if (hook && key.endsWith(".time_high_water")) {
      this.hook = undefined;
      await hook();
    }
    return super.set(key, value);
  }
}

const airGapped = (storage: MemoryStorage) =>
  new LicensingClient({
    config,
    fetch: (async () => {
      throw new TypeError("air-gapped");
    }) as never,
    now: () => t.clock.now().getTime(),
    storage,
  });

async function packageFor(app: LicensingClient): Promise<Uint8Array> {
  const response = await requestPackage(
    t,
    fx.licenseId,
    await app.createOfflineRequest({ machineInfo: MACHINE }),
  );
  if (response.status !== 200) throw new Error(JSON.stringify(response.error));
  return response.bytes;
}

const item = (storage: MemoryStorage, name: string) => storage.get(`svc.v1.live.${fx.productId}.${name}`);

test("storage cleared while a package loads gets the keys and trust bundle written back, so the device is valid after a reload", async () => {
  const storage = new MidLoadStorage();
  const app = airGapped(storage);
  const pkg = await packageFor(app);
  const keys = await item(storage, "device_keys");
  storage.hook = async () => {
    for (const key of storage.keys()) await storage.delete(key);
  };
  await app.loadOfflinePackage(pkg);
  expect(await item(storage, "device_keys")).toBe(keys);
  expect(await item(storage, "bundle")).toBeDefined();
  expect(await item(storage, "bundle_sequence")).toMatch(/^[1-9][0-9]*$/);
  expect(await airGapped(storage).licenseState()).toBe("valid");
});

test("keys replaced by another client while a package loads refuse it with DEVICE_KEYS_CHANGED, storing nothing of it", async () => {
  const storage = new MidLoadStorage();
  const app = airGapped(storage);
  const pkg = await packageFor(app);
  const otherKeys = generateDeviceKeys("ed25519");
  storage.hook = () => airGapped(storage).setDeviceKeys(otherKeys);
  const error = await refusal(app.loadOfflinePackage(pkg));
  // Not retryable: the package was made for the keys that are gone; a new request is needed.
  expect(error).toMatchObject({ kind: "storage", code: "DEVICE_KEYS_CHANGED", retryable: false });
  expect(await item(storage, "device_keys")).toBe(exportDeviceKeys(otherKeys));
  expect(await item(storage, "activation")).toBeUndefined();
  expect(await item(storage, "certificate")).toBeUndefined();
  // The device stays free to restore keys or ask for a package for the keys it now holds.
  const reloaded = airGapped(storage);
  expect(await reloaded.activationId()).toBeUndefined();
  await reloaded.loadOfflinePackage(await packageFor(reloaded));
  expect(await reloaded.licenseState()).toBe("valid");
});
