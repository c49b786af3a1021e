import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { activatedDevice, proofCall, runtimeFixture } from "../support/runtime.ts";

/**
 * Routes that take no body (deletes, two-factor unlock, a delivery's replay) refuse fields as
 * every other route refuses unknown ones: a caller who sends `{"reason": "..."}` learns that it
 * was not kept. No body and `{}` are what they accept.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

async function customerPath() {
  const created = await t.call("POST", "/mgmt/v1/customers", { body: { name: "Acme" }, headers: t.idem() });
  return `/mgmt/v1/customers/${created.body.data.public_id}`;
}

describe("a DELETE without a body schema", () => {
  test("with fields answers 422 naming each one and deletes nothing", async () => {
    const path = await customerPath();
    const response = await t.call("DELETE", path, { body: { reason: "churned", notify: true } });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors).toEqual({
      reason: ["is not a known field"],
      notify: ["is not a known field"],
    });
    expect((await t.call("GET", path)).status).toBe(200);
  });

  test.each([
    ["an array", []],
    ["a string", "churned"],
    ["null", null],
  ])("with %s for a body answers 422 and deletes nothing", async (_, body) => {
    const path = await customerPath();
    const response = await t.call("DELETE", path, {
      rawBody: JSON.stringify(body),
      headers: { "content-type": "application/json" },
    });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors)).toEqual(["body"]);
    expect((await t.call("GET", path)).status).toBe(200);
  });

  test("with {} or no body at all goes ahead", async () => {
    expect((await t.call("DELETE", await customerPath(), { body: {} })).status).toBe(204);
    expect((await t.call("DELETE", await customerPath())).status).toBe(204);
  });
});

test("a caller without the route's scope hears 403 before its body is judged", async () => {
  const path = await customerPath();
  const readOnly = t.keyFor("live", ["customers:read"], "read-only");
  const response = await t.call("DELETE", path, { key: readOnly, body: { reason: "x" } });
  expect(response.status).toBe(403);
});

test("a device's deactivation takes any JSON body its proof signs, as the protocol lets it (runtime routes are not held to this)", async () => {
  const fx = await runtimeFixture(t);
  const { device, activationId } = await activatedDevice(t, fx);
  const path = `/runtime/v1/activations/${activationId}`;
  const response = await proofCall(t, device, "DELETE", path, activationId, { reason: "uninstall" });
  expect(response.status).toBe(200);
  expect(response.body.data).toBe("deactivated");
});
