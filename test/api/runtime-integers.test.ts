import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
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
 * Integers a device sends are signed (JCS) and stored, so they stay within I-JSON: ±(2^53−1).
 * 1e308 is an integer to JavaScript, and 9007199254740993 arrives already rounded to 2^53.
 */
let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, { policy: { license_type: "subscription", max_machines: 5 } });
});
afterEach(() => t.close());

const activationCount = () =>
  t.deps.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM activations").get()?.n ?? 0;

/** A signed activation body, sent as text with `from` swapped for `to` (a number JSON.stringify cannot write). */
function activateRaw(device: TestDevice, extra: Record<string, unknown>, from?: string, to?: string) {
  const body = device.activationBody({
    licenseKey: fx.licenseKey,
    productId: fx.productId,
    clientTime: nowSec(t),
    extra,
  });
  const text = JSON.stringify(body);
  return t.call("POST", "/runtime/v1/activations", {
    key: null,
    rawBody: from && to ? text.replace(from, to) : text,
    headers: { "content-type": "application/json", "idempotency-key": `activation-${Math.random()}-x` },
  });
}

describe("activation create", () => {
  test("a machine_info integer of 1e308 answers 422 keyed by its path and activates nothing", async () => {
    const response = await activate(t, new TestDevice(), fx, {
      body: { machine_info: { os: "linux", arch: "x64", n: 1e308 } },
    });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors)).toEqual(["machine_info.n"]);
    expect(activationCount()).toBe(0);
  });

  test("9007199254740993 in machine_info (read as 2^53) answers 422 instead of being stored rounded", async () => {
    // Signed over what the server parses (2^53), so only the bound can refuse it.
    const response = await activateRaw(
      new TestDevice(),
      { machine_info: { os: "linux", arch: "x64", n: 2 ** 53 } },
      '"n":9007199254740992',
      '"n":9007199254740993',
    );
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors)).toEqual(["machine_info.n"]);
    expect(activationCount()).toBe(0);
  });

  test("a client_time beyond ±(2^53−1) answers 422 keyed client_time", async () => {
    const response = await activate(t, new TestDevice(), fx, { clientTime: 1e308 });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors)).toEqual(["client_time"]);
    expect(activationCount()).toBe(0);
  });

  test("the largest safe integers are taken and kept exactly", async () => {
    const info = { os: "linux", arch: "x64", up: Number.MAX_SAFE_INTEGER, down: -Number.MAX_SAFE_INTEGER };
    const response = await activate(t, new TestDevice(), fx, { body: { machine_info: info } });
    expect(response.status).toBe(201);
    const id = response.body.data.activation_id;
    expect((await t.call("GET", `/mgmt/v1/activations/${id}`)).body.data.machine.info).toEqual(info);
  });
});

test("a heartbeat whose machine_info holds 1e308 answers 422 and keeps the stored baseline", async () => {
  const { device, activationId } = await activatedDevice(t, fx);
  const response = await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
    machine_info: { os: "linux", arch: "x64", n: 1e308 },
  });
  expect(response.status).toBe(422);
  expect(Object.keys(response.body.error.details.errors)).toEqual(["machine_info.n"]);
  const seen = (await t.call("GET", `/mgmt/v1/activations/${activationId}`)).body.data;
  expect(seen.machine.info).toEqual({ os: "linux", arch: "x64" });
  expect(machineInfoDigest(seen.machine.info)).toBe(machineInfoDigest({ os: "linux", arch: "x64" }));
});
