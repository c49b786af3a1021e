import { afterEach, beforeEach, expect, test } from "bun:test";
import { MemoryStorage } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

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
