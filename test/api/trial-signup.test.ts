import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/** GET/PATCH /mgmt/v1/products/{id}/trial-signup: spec §4.3 rule 3. */
let t: TestContext;
let f: ReturnType<typeof factories>;
let productId: string;
let trialPolicyId: string;

beforeEach(() => {
  t = createTestContext();
  f = factories(t);
  productId = f.product().id;
  trialPolicyId = f.policy({ productId, licenseType: "trial", trialDays: 14, billingCycle: "none" }).id;
});
afterEach(() => t.close());

const path = (id = productId) => `/mgmt/v1/products/${id}/trial-signup`;
const patch = (body: unknown, headers: Record<string, string> = {}, key?: string) =>
  t.call("PATCH", path(), { body, headers, key });
const productVersion = async () => (await t.call("GET", `/mgmt/v1/products/${productId}`)).body.data.version;
const updatedEvents = () =>
  t.deps.sqlite
    .query<{ data: string }, [string]>(
      "SELECT data FROM audit_events WHERE type = 'product.updated' AND target_id = ? ORDER BY id",
    )
    .all(productId)
    .map((row) => JSON.parse(row.data));

describe("reading", () => {
  test("a new product has no policy, the default daily limit, and is not accepting", async () => {
    const response = await t.call("GET", path());
    expect(response.status).toBe(200);
    expect(response.body.data).toEqual({
      product_id: productId,
      policy_id: null,
      daily_limit: 100,
      status: "disabled",
      started_last_24_hours: 0,
      version: 1,
    });
    expect(response.headers.get("etag")).toBe('"1"');
  });

  test("another environment's product is 404 and an archived one is 409 PRODUCT_ARCHIVED", async () => {
    expect((await t.call("GET", path(), { key: t.keys.test })).status).toBe(404);
    await t.call("DELETE", `/mgmt/v1/products/${productId}`);
    const archived = await t.call("GET", path());
    expect(archived.status).toBe(409);
    expect(archived.body.error.code).toBe("PRODUCT_ARCHIVED");
    const change = await patch({ daily_limit: 5 });
    expect(change.status).toBe(409);
    expect(change.body.error.code).toBe("PRODUCT_ARCHIVED");
  });
});

describe("choosing a policy", () => {
  test("choosing a trial policy opens sign-ups, bumps the product version and audits product.updated", async () => {
    const response = await patch({ policy_id: trialPolicyId, daily_limit: 20 });
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({
      policy_id: trialPolicyId,
      daily_limit: 20,
      status: "accepting",
      version: 2,
    });
    expect(response.headers.get("etag")).toBe('"2"');
    expect(await productVersion()).toBe(2);
    expect(updatedEvents()).toEqual([
      {
        changes: ["trial_signup.policy_id", "trial_signup.daily_limit"],
        trial_signup: { policy_id: trialPolicyId, daily_limit: 20 },
      },
    ]);
    expect((await t.call("GET", path())).body.data).toEqual(response.body.data);
  });

  test("resending the same body changes nothing: same answer, no new version, no second audit event", async () => {
    const first = await patch({ policy_id: trialPolicyId, daily_limit: 20 });
    const again = await patch(
      { policy_id: trialPolicyId, daily_limit: 20 },
      { "idempotency-key": "ignored-key-12345" },
    );
    expect(again.status).toBe(200);
    expect(again.body.data).toEqual(first.body.data);
    expect(updatedEvents()).toHaveLength(1);
  });

  test.each([
    ["a policy that does not exist", () => "pol_01JZ8X4M6Q2T9V3B7N5K1R0W8Y", "does not exist for this key"],
    [
      "a policy of another product",
      () => f.policy({ productId: f.product().id, licenseType: "trial" }).id,
      "belongs to another product",
    ],
    ["a non-trial policy", () => f.policy({ productId }).id, "must be a trial policy (license_type trial)"],
    [
      "a retired trial policy",
      () => f.policy({ productId, licenseType: "trial", status: "retired" }).id,
      "is retired; choose an active trial policy",
    ],
    [
      "a named-user trial policy",
      () => f.policy({ productId, licenseType: "trial", identityMode: "named_user" }).id,
      "must use identity_mode device",
    ],
    [
      "another environment's policy",
      () =>
        f.policy({
          productId: f.product({ environment: "test" }).id,
          environment: "test",
          licenseType: "trial",
        }).id,
      "does not exist for this key",
    ],
  ])("%s is 422 keyed by policy_id and changes nothing", async (_name, make, message) => {
    const response = await patch({ policy_id: make() });
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("VALIDATION_FAILED");
    expect(response.body.error.details.errors.policy_id).toContain(message);
    expect(await productVersion()).toBe(1);
    expect(updatedEvents()).toHaveLength(0);
  });

  test("choosing or replacing a policy needs trial_licenses: 403 PLAN_ENTITLEMENT_REQUIRED", async () => {
    await patch({ policy_id: trialPolicyId });
    t.workspace.setPlan("personal");
    const other = f.policy({ productId, licenseType: "trial", trialDays: 7 }).id;
    const replace = await patch({ policy_id: other });
    expect(replace.status).toBe(403);
    expect(replace.body.error).toMatchObject({
      code: "PLAN_ENTITLEMENT_REQUIRED",
      details: { entitlement: "trial_licenses" },
    });
    expect((await t.call("GET", path())).body.data).toMatchObject({
      policy_id: trialPolicyId,
      status: "not_entitled",
    });
  });

  test("without the entitlement, clearing the policy and changing only daily_limit still work", async () => {
    await patch({ policy_id: trialPolicyId });
    t.workspace.setPlan("free");
    const limit = await patch({ daily_limit: 7 });
    expect(limit.status).toBe(200);
    expect(limit.body.data.daily_limit).toBe(7);
    const same = await patch({ policy_id: trialPolicyId, daily_limit: 7 });
    expect(same.status).toBe(200);
    const cleared = await patch({ policy_id: null });
    expect(cleared.status).toBe(200);
    expect(cleared.body.data).toMatchObject({ policy_id: null, status: "disabled" });
  });

  test("a retired chosen policy leaves the product not accepting until another is chosen", async () => {
    await patch({ policy_id: trialPolicyId });
    await t.call("DELETE", `/mgmt/v1/policies/${trialPolicyId}`);
    expect((await t.call("GET", path())).body.data.status).toBe("policy_unavailable");
  });
});

describe("daily_limit", () => {
  test.each([0, -1, 100_001, 2.5, "10", null])(
    "daily_limit %p is 422 keyed by daily_limit",
    async (value) => {
      const response = await patch({ daily_limit: value });
      expect(response.status).toBe(422);
      expect(Object.keys(response.body.error.details.errors)).toEqual(["daily_limit"]);
      expect(await productVersion()).toBe(1);
    },
  );

  test("a started trial count at or over the limit shows limit_reached", async () => {
    await patch({ policy_id: trialPolicyId, daily_limit: 1 });
    const license = f.license({ productId, policyId: trialPolicyId, licenseType: "trial" });
    t.deps.sqlite
      .query(
        `INSERT INTO trial_grants (id, environment, product_id, license_id, kind, email_lookup, device_thumbprint, verification_id, created_at)
         VALUES ('trg_1', 'live', ?, ?, 'started', 'x', 'y', 'ver_1', ?)`,
      )
      .run(productId, license.row.id, t.clock.now().getTime());
    expect((await t.call("GET", path())).body.data).toMatchObject({
      status: "limit_reached",
      started_last_24_hours: 1,
    });
    t.clock.advance(86_401);
    expect((await t.call("GET", path())).body.data).toMatchObject({
      status: "accepting",
      started_last_24_hours: 0,
    });
  });
});

describe("requests", () => {
  test("a stale If-Match is 409 VERSION_CONFLICT and changes nothing; the current one applies", async () => {
    const stale = await patch({ daily_limit: 5 }, { "if-match": '"7"' });
    expect(stale.status).toBe(409);
    expect(stale.body.error.code).toBe("VERSION_CONFLICT");
    expect((await t.call("GET", path())).body.data.daily_limit).toBe(100);
    const fresh = await patch({ daily_limit: 5 }, { "if-match": "1" });
    expect(fresh.status).toBe(200);
    expect(fresh.body.data.version).toBe(2);
  });

  test("the If-Match is the product's version, which a product rename also moves", async () => {
    await t.call("PATCH", `/mgmt/v1/products/${productId}`, { body: { name: "New name" } });
    expect((await patch({ daily_limit: 5 }, { "if-match": "1" })).status).toBe(409);
    expect((await patch({ daily_limit: 5 }, { "if-match": "2" })).status).toBe(200);
  });

  test("unknown fields are 422 and a read-only key is 403 INSUFFICIENT_SCOPE", async () => {
    expect((await patch({ status: "accepting" })).status).toBe(422);
    const reader = t.keyFor("live", ["products:read"]);
    const refused = await patch({ daily_limit: 5 }, {}, reader);
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("INSUFFICIENT_SCOPE");
    expect((await t.call("GET", path(), { key: reader })).status).toBe(200);
  });

  test("a test key works on its own test product", async () => {
    const testProduct = f.product({ environment: "test" }).id;
    const testPolicy = f.policy({ productId: testProduct, environment: "test", licenseType: "trial" }).id;
    const response = await t.call("PATCH", path(testProduct), {
      key: t.keys.test,
      body: { policy_id: testPolicy },
    });
    expect(response.status).toBe(200);
    expect(response.body.data.status).toBe("accepting");
  });
});
