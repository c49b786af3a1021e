import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, requestPackage, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * Spec §7.3: PRODUCT_ARCHIVED covers changes under an archived product. Nothing that grants,
 * extends or reconfigures is accepted once the product is archived; what only takes access away
 * (revoking, suspending, retiring a policy, removing a device or a user) still is, and each test
 * checks that too (docs/api.md "Archived products").
 */
let t: TestContext;
let fx: RuntimeFixture;
let trialPolicyId: string;
let trialId: string;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, { policy: { license_type: "subscription", validation_mode: "hybrid" } });
  const trialPolicy = await t.call("POST", "/mgmt/v1/policies", {
    body: { product_id: fx.productId, name: "Trial", license_type: "trial" },
    headers: t.idem(),
  });
  trialPolicyId = trialPolicy.body.data.public_id;
  const trial = await t.call("POST", "/mgmt/v1/licenses", {
    body: { product_id: fx.productId, policy_id: trialPolicyId },
    headers: t.idem(),
  });
  trialId = trial.body.data.public_id;
});
afterEach(() => t.close());

const archive = async () => {
  const response = await t.call("DELETE", `/mgmt/v1/products/${fx.productId}`);
  expect(response.status).toBe(204);
};
const auditCount = () =>
  (t.deps.sqlite.query("SELECT count(*) AS n FROM audit_events").get() as { n: number }).n;
const readLicense = async (id: string) => (await t.call("GET", `/mgmt/v1/licenses/${id}`)).body.data;

function expectArchived(response: Awaited<ReturnType<TestContext["call"]>>) {
  expect(response.status).toBe(409);
  expect(response.body.error.code).toBe("PRODUCT_ARCHIVED");
  expect(response.body.error.details.product_id).toBe(fx.productId);
}

describe("under an archived product, changes that grant or reconfigure answer 409 PRODUCT_ARCHIVED", () => {
  test("converting a trial issues no full license: the trial, its version and the audit log are unchanged", async () => {
    await archive();
    const before = await readLicense(trialId);
    const events = auditCount();
    const response = await t.call("POST", `/mgmt/v1/licenses/${trialId}/convert-trial`, {
      body: { target_policy_id: fx.policyId },
    });
    expectArchived(response);
    expect(await readLicense(trialId)).toEqual(before);
    expect(before).toMatchObject({ license_type: "trial", policy_id: trialPolicyId, converted_at: null });
    expect(auditCount()).toBe(events);
    // Taking access away is still allowed: the trial can be revoked.
    expect((await t.call("DELETE", `/mgmt/v1/licenses/${trialId}`)).status).toBe(204);
    expect((await readLicense(trialId)).status).toBe("revoked");
  });

  test("a policy PATCH changes nothing: same settings, same ETag, no event", async () => {
    await archive();
    const before = await t.call("GET", `/mgmt/v1/policies/${fx.policyId}`);
    const events = auditCount();
    const response = await t.call("PATCH", `/mgmt/v1/policies/${fx.policyId}`, {
      body: { max_machines: 50 },
      headers: { "if-match": before.headers.get("etag") ?? "" },
    });
    expectArchived(response);
    const after = await t.call("GET", `/mgmt/v1/policies/${fx.policyId}`);
    expect(after.body.data).toEqual(before.body.data);
    expect(after.headers.get("etag")).toBe(before.headers.get("etag"));
    expect(auditCount()).toBe(events);
    // Retiring a policy only takes away: still allowed.
    expect((await t.call("DELETE", `/mgmt/v1/policies/${fx.policyId}`)).status).toBe(204);
    expect((await t.call("GET", `/mgmt/v1/policies/${fx.policyId}`)).body.data.status).toBe("retired");
  });

  test("a license PATCH that extends, overrides, annotates or reinstates changes nothing", async () => {
    const suspended = await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, {
      body: { status_action: "suspended" },
    });
    expect(suspended.status).toBe(200);
    await archive();
    const before = await readLicense(fx.licenseId);
    const events = auditCount();
    const future = new Date(t.clock.now().getTime() + 400 * 86_400_000).toISOString();
    for (const body of [
      { expires_at: future },
      { max_machines_override: 50 },
      { entitlements: { pro: true } },
      { metadata: { note: "x" } },
      { renewal_authority: "external_billing" },
      { status_action: "active" },
      { status_action: "suspended", metadata: { note: "x" } },
    ]) {
      expectArchived(await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body }));
    }
    expect(await readLicense(fx.licenseId)).toEqual(before);
    expect(auditCount()).toBe(events);
    // Suspending, with a reason, only takes away: still allowed.
    const suspendedTrial = await t.call("PATCH", `/mgmt/v1/licenses/${trialId}`, {
      body: { status_action: "suspended", reason: "product withdrawn" },
    });
    expect(suspendedTrial.status).toBe(200);
    expect(suspendedTrial.body.data).toMatchObject({
      status: "suspended",
      status_reason: "product withdrawn",
    });
  });

  test("an offline package is not issued: no package, no activation, no event", async () => {
    const config = await integrationConfig(t, fx.productId);
    const request = await sdkClient(t, config).createOfflineRequest({ machineInfo: MACHINE });
    await archive();
    const events = auditCount();
    const response = await requestPackage(t, fx.licenseId, request);
    expect(response.status).toBe(409);
    expect(response.error).toMatchObject({ code: "PRODUCT_ARCHIVED", details: { product_id: fx.productId } });
    const count = (table: string) =>
      (t.deps.sqlite.query(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n;
    expect(count("offline_packages")).toBe(0);
    expect(count("activations")).toBe(0);
    expect(auditCount()).toBe(events);
  });

  test("a license of an archived product takes no new user assignment", async () => {
    const named = await runtimeFixture(t, { policy: { identity_mode: "named_user" } });
    const user = await t.call("POST", "/mgmt/v1/license-users", { body: { email: "ada@example.com" } });
    expect((await t.call("DELETE", `/mgmt/v1/products/${named.productId}`)).status).toBe(204);
    const events = auditCount();
    const response = await t.call("POST", `/mgmt/v1/licenses/${named.licenseId}/assignments`, {
      body: { user_id: user.body.data.public_id },
    });
    expect(response.status).toBe(409);
    expect(response.body.error).toMatchObject({
      code: "PRODUCT_ARCHIVED",
      details: { product_id: named.productId },
    });
    const assigned = await t.call("GET", `/mgmt/v1/licenses/${named.licenseId}/assignments`);
    expect(assigned.body.data).toEqual([]);
    expect(auditCount()).toBe(events);
  });
});
