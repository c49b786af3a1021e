import { afterEach, beforeEach, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, requestPackage, sdkClient } from "../support/offline.ts";
import {
  activate,
  activatedDevice,
  heartbeatPath,
  nowSec,
  proofCall,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";

/**
 * Offline packages and machine slots (docs/protocol.md §13, §17): a device that lost its slot by
 * going silent is a new device to the offline route too, so the route never binds more devices
 * than max_machines.
 */
let t: TestContext;
let fx: RuntimeFixture;
let config: Record<string, unknown>;

const HEARTBEAT_SEC = 3600;
const GRACE_SEC = 3600;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: {
      validation_mode: "hybrid",
      heartbeat_required: true,
      heartbeat_sec: HEARTBEAT_SEC,
      network_grace_sec: GRACE_SEC,
      max_machines: 1,
    },
    license: { expires_at: new Date(t.clock.now().getTime() + 90 * 86_400_000).toISOString() },
  });
  config = await integrationConfig(t, fx.productId);
});
afterEach(() => t.close());

/** Every row the route could write: activations, packages and the audit log. */
const snapshot = () => ({
  activations: t.deps.sqlite
    .query("SELECT id, status, deactivation_reason, offline_until, last_seen_at FROM activations ORDER BY id")
    .all(),
  packages: t.deps.sqlite.query("SELECT id FROM offline_packages").all(),
  audit: t.deps.sqlite.query("SELECT id FROM audit_events").all(),
});

/** A device's offline request, signed by the contract (§17) with the test device's own keys. */
function offlineRequest(device: TestDevice, kemPublic = device.kemPublic): Record<string, unknown> {
  const request = {
    format: "service-offline-request-v1",
    product_id: fx.productId,
    device_signing_public_key: device.signingPublic,
    device_kem_public_key: kemPublic,
    machine_info: MACHINE,
    nonce: randomBytes(16).toString("base64url"),
    generated_at: nowSec(t),
  };
  return { ...request, device_proof: device.sign(`Service-Offline-Request-v1\n${canonicalize(request)}`) };
}

test("a displaced device's offline request on a full license answers 409 MACHINE_LIMIT_REACHED and changes nothing", async () => {
  const displaced = new TestDevice();
  expect((await activate(t, displaced, fx)).status).toBe(201);
  t.clock.advance(HEARTBEAT_SEC + GRACE_SEC + 60);
  const other = await activatedDevice(t, fx);
  const before = snapshot();

  const response = await requestPackage(t, fx.licenseId, offlineRequest(displaced));

  expect([response.status, response.error?.code]).toEqual([409, "MACHINE_LIMIT_REACHED"]);
  expect(snapshot()).toEqual(before);
  // Online activation with the same keys agrees: the displaced device finds no room either way.
  const online = await activate(t, displaced, fx);
  expect([online.status, online.body.error?.code]).toEqual([409, "MACHINE_LIMIT_REACHED"]);
  const beat = await proofCall(
    t,
    other.device,
    "POST",
    heartbeatPath(other.activationId),
    other.activationId,
    {
      machine_info_digest: machineInfoDigest({ os: "linux", arch: "x64" }),
    },
  );
  expect(beat.status).toBe(200);
});

test("an active device asking for a package with another KEM key answers 409 DEVICE_KEY_MISMATCH naming its activation, and changes nothing", async () => {
  const { device, activationId } = await activatedDevice(t, fx);
  const before = snapshot();

  const response = await requestPackage(t, fx.licenseId, offlineRequest(device, new TestDevice().kemPublic));

  expect([response.status, response.error?.code]).toEqual([409, "DEVICE_KEY_MISMATCH"]);
  expect(response.error.details).toEqual({ activation_id: activationId });
  expect(snapshot()).toEqual(before);
  expect((await requestPackage(t, fx.licenseId, offlineRequest(device))).status).toBe(200);
});

test("a silent device whose slot nobody took gets its package on the same activation", async () => {
  const app = sdkClient(t, config);
  await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  t.clock.advance(HEARTBEAT_SEC + GRACE_SEC + 60);
  const [before] = t.deps.sqlite.query<{ id: string }, []>("SELECT id FROM activations").all();

  const response = await requestPackage(
    t,
    fx.licenseId,
    await app.createOfflineRequest({ machineInfo: MACHINE }),
  );

  expect(response.status).toBe(200);
  const rows = t.deps.sqlite
    .query<{ id: string; status: string }, []>("SELECT id, status FROM activations")
    .all();
  expect(rows).toEqual([{ id: before?.id as string, status: "active" }]);
  // The package now holds the slot: a new device is refused online.
  const newcomer = await activate(t, new TestDevice(), fx);
  expect([newcomer.status, newcomer.body.error?.code]).toEqual([409, "MACHINE_LIMIT_REACHED"]);
});

test("a package's device holds its slot until the second the package names, not a fraction later", async () => {
  // Half past a second, so an expiry carried at millisecond precision would outlast its manifest.
  t.clock.freeze();
  t.clock.advance(((1500 - (t.clock.now().getTime() % 1000)) % 1000) / 1000);
  const app = sdkClient(t, config);
  // Three hours: at its end the device is stale by the heartbeat rule, so only the package holds it.
  const asked = new Date(t.clock.now().getTime() + 3 * 3_600_000);
  const response = await requestPackage(
    t,
    fx.licenseId,
    await app.createOfflineRequest({ machineInfo: MACHINE }),
    { expires_at: asked.toISOString() },
  );
  expect(response.status).toBe(200);
  const { expiresAt } = await app.loadOfflinePackage(response.bytes);
  expect(expiresAt).toBe(Math.floor(asked.getTime() / 1000));
  const [row] = t.deps.sqlite
    .query<{ offline_until: number }, []>("SELECT offline_until FROM activations")
    .all();
  expect(row?.offline_until).toBe(expiresAt * 1000);

  t.clock.advance(expiresAt - 1 - t.clock.now().getTime() / 1000);
  const early = await activate(t, new TestDevice(), fx);
  expect([early.status, early.body.error?.code]).toEqual([409, "MACHINE_LIMIT_REACHED"]);
  t.clock.advance(1);
  expect((await activate(t, new TestDevice(), fx)).status).toBe(201);
});

test("an expires_at later within the current second is not in the future: 422, and nothing is issued", async () => {
  t.clock.freeze();
  t.clock.advance(((1015 - (t.clock.now().getTime() % 1000)) % 1000) / 1000);
  const before = snapshot();
  const app = sdkClient(t, config);
  const lastOfTheSecond = new Date(t.clock.now().getTime() + 984);
  const response = await requestPackage(
    t,
    fx.licenseId,
    await app.createOfflineRequest({ machineInfo: MACHINE }),
    { expires_at: lastOfTheSecond.toISOString() },
  );
  expect([response.status, response.error?.code]).toEqual([422, "VALIDATION_FAILED"]);
  expect(response.error.details.errors).toEqual({ expires_at: ["must be in the future"] });
  expect(snapshot()).toEqual(before);
});
