import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { MemoryStorage } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";
import { FakeLocks, LaggingTabs } from "./support/shared-storage.ts";

/**
 * Two clients on one storage (two tabs) are one device with one activation: when both activate
 * at once with different license keys, the service makes two activations, and the one answered
 * second must not silently overwrite the first, leaving a machine slot nothing can use.
 */
let t: TestContext;
let fx: RuntimeFixture;
let config: Record<string, unknown>;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, { policy: { validation_mode: "hybrid", max_machines: 2 } });
  config = await integrationConfig(t, fx.productId);
});
afterEach(() => t.close());

/** The in-process service, with activation answers held until the test releases them. */
function heldActivations() {
  const waiting: (() => void)[] = [];
  let arrived: () => void = () => undefined;
  const fetch = async (url: string, init?: RequestInit) => {
    const response = await t.app.handle(new Request(url, init));
    if (init?.method === "POST" && url.endsWith("/runtime/v1/activations"))
      await new Promise<void>((release) => {
        waiting.push(release);
        arrived();
      });
    return response;
  };
  const arrivals = (n: number) =>
    new Promise<void>((resolve) => {
      arrived = () => {
        if (waiting.length >= n) resolve();
      };
      arrived();
    });
  return { fetch: fetch as unknown as typeof globalThis.fetch, waiting, arrivals };
}

test("of two tabs activating different licenses at once, the one answered second is refused as ALREADY_ACTIVATED and its slot given back", async () => {
  const created = await t.call("POST", "/mgmt/v1/licenses", {
    body: { product_id: fx.productId, policy_id: fx.policyId },
    headers: t.idem(),
  });
  expect(created.status).toBe(201);
  const storage = new MemoryStorage();
  const held = heldActivations();
  const tabA = sdkClient(t, config, { storage, fetch: held.fetch });
  const tabB = sdkClient(t, config, { storage, fetch: held.fetch });
  await tabA.deviceKeys();
  // Both pass the "not activated" check before either answer is stored.
  const first = tabA.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  await held.arrivals(1);
  const second = refusal(tabB.activate({ licenseKey: created.body.data.key, machineInfo: MACHINE }));
  await held.arrivals(2);
  held.waiting[0]?.();
  const stored = await first;
  held.waiting[1]?.();
  const error = await second;

  expect(error).toMatchObject({ kind: "usage", code: "ALREADY_ACTIVATED" });
  expect(error.details.held_activation_id).toBe(stored.activationId);
  const orphan = error.details.activation_id as string;
  expect(orphan).not.toBe(stored.activationId);
  expect(await tabA.activationId()).toBe(stored.activationId);
  expect(await tabB.licenseInfo()).toMatchObject({ state: "valid", licenseId: fx.licenseId });
  // The refused activation was deactivated with its own proof: no slot is left held for nothing.
  const seen = (await t.call("GET", `/mgmt/v1/activations/${orphan}`)).body.data;
  expect(seen.status).toBe("deactivated");
  expect((await t.call("GET", `/mgmt/v1/activations/${stored.activationId}`)).body.data.status).toBe(
    "active",
  );
});

/**
 * Two tabs at first run, whose `localStorage` shows each one's writes to the other late (real
 * Chromium, about one run in ten: the Web Lock orders the key writes but does not deliver them).
 * Both make a key pair; the request signed with the keys that lost is refused on its answer
 * (DEVICE_KEYS_CHANGED), its slot given back, and made once more with the keys stored.
 */
describe("two tabs whose storage shows each other's writes late, at first run", () => {
  /** A fetch that holds the first activation answer until `release()`; `answered` once it came. */
  function holdFirstActivationAnswer() {
    let release: () => void = () => undefined;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    let answered: () => void = () => undefined;
    const arrived = new Promise<void>((resolve) => {
      answered = resolve;
    });
    let activations = 0;
    const fetch = async (url: string, init?: RequestInit) => {
      const response = await t.app.handle(new Request(url, init));
      if (init?.method === "POST" && url.endsWith("/runtime/v1/activations") && activations++ === 0) {
        answered();
        await held;
      }
      return response;
    };
    return { fetch: fetch as unknown as typeof globalThis.fetch, arrived, release };
  }

  async function licenseOfOneMachine(): Promise<{ id: string; key: string }> {
    const policy = await t.call("POST", "/mgmt/v1/policies", {
      body: { product_id: fx.productId, name: "One", validation_mode: "hybrid", max_machines: 1 },
      headers: t.idem(),
    });
    expect(policy.status).toBe(201);
    const license = await t.call("POST", "/mgmt/v1/licenses", {
      body: { product_id: fx.productId, policy_id: policy.body.data.public_id },
      headers: t.idem(),
    });
    expect(license.status).toBe(201);
    return { id: license.body.data.public_id, key: license.body.data.key };
  }

  const statuses = async (licenseId: string) =>
    ((await t.call("GET", `/mgmt/v1/licenses/${licenseId}/activations`)).body.data as { status: string }[])
      .map((a) => a.status)
      .sort();

  test("the tab whose keys lost gets the other tab's activation back, and both end with it", async () => {
    const tabs = new LaggingTabs();
    const locks = new FakeLocks();
    const gate = holdFirstActivationAnswer();
    const tab1 = sdkClient(t, config, { storage: tabs.tab(), locks });
    const tab2 = sdkClient(t, config, { storage: tabs.tab(), locks, fetch: gate.fetch });
    const license = { licenseKey: fx.licenseKey, machineInfo: MACHINE };
    const second = tab2.activate(license);
    await gate.arrived;
    // Tab 1 takes the lock after tab 2 wrote its keys under it, and still reads none.
    const first = await tab1.activate(license);
    tabs.deliver();
    gate.release();
    const retried = await second;

    expect(retried.activationId).toBe(first.activationId);
    expect((await tab1.deviceKeys()).signing.publicKey).toBe((await tab2.deviceKeys()).signing.publicKey);
    expect(await statuses(fx.licenseId)).toEqual(["active", "deactivated"]);
    tabs.deliver();
    const reloaded = sdkClient(t, config, { storage: tabs.tab(), locks });
    expect(await reloaded.licenseInfo()).toMatchObject({ state: "valid", activationId: first.activationId });
    await reloaded.heartbeat();
  });

  test("on a license of one machine, the slot the losing keys took is given back before the retry, which activates the device", async () => {
    const one = await licenseOfOneMachine();
    const tabs = new LaggingTabs();
    const locks = new FakeLocks();
    const gate = holdFirstActivationAnswer();
    const tab1 = sdkClient(t, config, { storage: tabs.tab(), locks });
    const tab2 = sdkClient(t, config, { storage: tabs.tab(), locks, fetch: gate.fetch });
    const license = { licenseKey: one.key, machineInfo: MACHINE };
    const second = tab2.activate(license);
    await gate.arrived;
    // Tab 2's keys hold the one slot, so tab 1, with its own keys, is refused; its keys, written
    // last, are the ones both tabs read once the writes are delivered.
    expect((await refusal(tab1.activate(license))).code).toBe("MACHINE_LIMIT_REACHED");
    tabs.deliver();
    gate.release();
    const retried = await second;

    expect((await tab2.deviceKeys()).signing.publicKey).toBe((await tab1.deviceKeys()).signing.publicKey);
    expect(await statuses(one.id)).toEqual(["active", "deactivated"]);
    tabs.deliver();
    // The device is activated: the tab that was refused reads it, as the documented pattern says.
    expect(await tab1.activationId()).toBe(retried.activationId);
    expect(await tab1.licenseInfo()).toMatchObject({ state: "valid", licenseId: one.id });
    await tab1.heartbeat();
  });
});
