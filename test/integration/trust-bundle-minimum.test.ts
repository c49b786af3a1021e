import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TrustService } from "../../src/modules/trust/service.ts";
import { MemoryStorage, SdkError } from "../../src/sdk/index.ts";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, requestPackage, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * The integration config's minimum_trust_bundle_sequence: the oldest bundle still safe to accept.
 * An air-gapped device only ever has the bundle its package carried, so a minimum that followed
 * every rotation would strand it as soon as the app shipped a config downloaded after one.
 */
let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { validation_mode: "offline", max_machines: 2 },
    license: { expires_at: new Date(t.clock.now().getTime() + 365 * 86_400_000).toISOString() },
  });
});
afterEach(() => t.close());

const minimumOf = (config: Record<string, unknown>) =>
  (config.trust_anchor as { minimum_trust_bundle_sequence: number }).minimum_trust_bundle_sequence;
const airGapped = (() => Promise.reject(new TypeError("no network"))) as unknown as typeof fetch;

/** A device that loaded a package under the product's first key, and never goes online. */
async function offlineDevice() {
  const storage = new MemoryStorage();
  const app = sdkClient(t, await integrationConfig(t, fx.productId), { storage, fetch: airGapped });
  const issued = await requestPackage(
    t,
    fx.licenseId,
    await app.createOfflineRequest({ machineInfo: MACHINE }),
  );
  await app.loadOfflinePackage(issued.bytes);
  return { storage, bytes: issued.bytes };
}

test("a rotation leaves the minimum at the first bundle, so the next release's config keeps an air-gapped device's package", async () => {
  const device = await offlineDevice();
  expect(minimumOf(await integrationConfig(t, fx.productId))).toBe(fx.bundle.sequence);
  new TrustService(t.deps).rotate(fx.productId, { retainSec: 400 * 86_400 });
  const nextRelease = await integrationConfig(t, fx.productId);
  expect(minimumOf(nextRelease)).toBe(fx.bundle.sequence);
  const app = sdkClient(t, nextRelease, { storage: device.storage, fetch: airGapped });
  expect(await app.licenseState()).toBe("valid");
  await app.loadOfflinePackage(device.bytes);
  expect(await app.licenseState()).toBe("valid");
});

test("a key declared compromised raises the minimum to the first bundle that says so, and older bundles are refused", async () => {
  const device = await offlineDevice();
  const trust = new TrustService(t.deps);
  const rotation = trust.rotate(fx.productId, { retainSec: 400 * 86_400 });
  const compromisedKey = rotation.retired?.key_id as string;
  const retirement = trust.retire(compromisedKey, { compromised: true });
  const afterCompromise = await integrationConfig(t, fx.productId);
  expect(minimumOf(afterCompromise)).toBe(retirement.trust_bundle_sequence);
  expect(retirement.trust_bundle_sequence).toBe(fx.bundle.sequence + 2);
  // Later changes that compromise nothing new leave it there.
  trust.rotate(fx.productId, { retainSec: 400 * 86_400 });
  expect(minimumOf(await integrationConfig(t, fx.productId))).toBe(retirement.trust_bundle_sequence);
  const app = sdkClient(t, afterCompromise, { storage: device.storage, fetch: airGapped });
  expect(await app.licenseState()).toBe("invalid");
  const refused = await app.loadOfflinePackage(device.bytes).then(
    () => undefined,
    (error: unknown) => error,
  );
  expect(refused).toBeInstanceOf(SdkError);
  expect((refused as SdkError).code).toBe("BUNDLE_SEQUENCE_ROLLBACK");
});

test("migration 0031 keeps every existing product's floor at its current sequence", () => {
  const dir = mkdtempSync(join(tmpdir(), "licensing-0031-"));
  const store = openStore(join(dir, "licensing.db"));
  try {
    const migrations = embeddedMigrations();
    const at = migrations.findIndex((m) => m.tag.startsWith("0031_"));
    expect(at).toBeGreaterThan(0);
    migrate(store.sqlite, migrations.slice(0, at));
    store.sqlite.run(
      `INSERT INTO products (id, environment, name, code, status, trust_bundle_sequence, signing_status, created_at, updated_at)
       VALUES ('prod_rotated', 'live', 'A', 'a', 'active', 5, 'ready', 0, 0),
              ('prod_pending', 'live', 'B', 'b', 'active', 0, 'pending', 0, 0)`,
    );
    migrate(store.sqlite, migrations);
    expect(
      store.sqlite
        .query("SELECT id, trust_bundle_minimum_sequence AS minimum FROM products ORDER BY id")
        .all(),
    ).toEqual([
      { id: "prod_pending", minimum: 0 },
      { id: "prod_rotated", minimum: 5 },
    ]);
  } finally {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
