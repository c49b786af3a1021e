import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createServices } from "../../src/services.ts";
import { factories } from "../support/factories.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";

let t: TestContext;
let f: ReturnType<typeof factories>;
let productId: string;
let policyId: string;
beforeEach(() => {
  t = createTestContext();
  f = factories(t);
  const catalog = f.catalog("live", { entitlements: { export: true, beta: false } });
  productId = catalog.product.id;
  policyId = catalog.policy.id;
});
afterEach(() => t.close());

const create = (body: Record<string, unknown>) =>
  t.call("POST", "/mgmt/v1/licenses", { body, headers: t.idem() });
const base = () => ({ product_id: productId, policy_id: policyId });
const DAY = 86_400_000;

describe("happy path", () => {
  test("a license from product and policy alone carries a Crockford key stored only encrypted", async () => {
    const response = await create(base());
    expect(response.status).toBe(201);
    const license = response.body.data;
    expect(license.key).toMatch(/^[0-9A-HJKMNP-TV-Z]{5}(-[0-9A-HJKMNP-TV-Z]{5}){4}$/);
    expect(license).toMatchObject({
      status: "active",
      license_type: "perpetual",
      expires_at: null,
      version: 1,
      max_machines: 1,
    });
    const stored = t.deps.sqlite
      .query<{ key_ciphertext: string; key_lookup: string }, [string]>(
        "SELECT key_ciphertext, key_lookup FROM licenses WHERE id = ?",
      )
      .get(license.public_id);
    const compact = license.key.replaceAll("-", "");
    expect(stored?.key_ciphertext).not.toContain(compact);
    expect(stored?.key_lookup).not.toContain(compact);
    const read = await t.call("GET", `/mgmt/v1/licenses/${license.public_id}`);
    expect(read.body.data.key).toBe(license.key);
  });

  test("a device may type the key in any case, with or without dashes", async () => {
    const license = (await create(base())).body.data;
    const services = createServices(t.deps, { baseUrl: BASE_URL });
    for (const typed of [
      license.key,
      license.key.toLowerCase(),
      license.key.replaceAll("-", ""),
      ` ${license.key} `,
    ]) {
      expect(services.licenses.findByKey(typed)?.id).toBe(license.public_id);
    }
    expect(services.licenses.findByKey("AAAAA-AAAAA-AAAAA-AAAAA-AAAAA")).toBeUndefined();
  });

  test("expiry defaults from the policy kind: a trial runs trial_days, a subscription one billing cycle", async () => {
    const trialPolicy = f.policy({ productId, licenseType: "trial", trialDays: 10 });
    const trial = await create({ product_id: productId, policy_id: trialPolicy.id });
    const now = t.clock.now().getTime();
    expect(new Date(trial.body.data.expires_at).getTime() - now).toBeCloseTo(10 * DAY, -4);
    const subPolicy = f.policy({ productId, licenseType: "subscription", billingCycle: "monthly" });
    const sub = await create({ product_id: productId, policy_id: subPolicy.id });
    const days = (new Date(sub.body.data.expires_at).getTime() - now) / DAY;
    expect(days).toBeGreaterThanOrEqual(28);
    expect(days).toBeLessThanOrEqual(31);
  });

  test("expires_at and expiry are one field: either may be sent, or both when equal", async () => {
    const at = new Date(t.clock.now().getTime() + 30 * DAY).toISOString();
    expect((await create({ ...base(), expiry: at })).body.data.expires_at).toBe(at);
    expect((await create({ ...base(), expires_at: at, expiry: at })).status).toBe(201);
  });

  test("effective entitlements and limits fold the license's overrides over the policy", async () => {
    const license = (await create({ ...base(), entitlements: { beta: true }, max_machines: 5 })).body.data;
    expect(license.entitlements).toEqual({ export: true, beta: true });
    expect(license.entitlement_overrides).toEqual({ beta: true });
    expect(license).toMatchObject({ max_machines: 5, max_machines_override: 5 });
    const cleared = await t.call("PATCH", `/mgmt/v1/licenses/${license.public_id}`, {
      body: { max_machines_override: null },
    });
    expect(cleared.body.data).toMatchObject({ max_machines: 1, max_machines_override: null, version: 2 });
  });

  test("suspending and reinstating move the status and leave audit events", async () => {
    const id = (await create(base())).body.data.public_id;
    const suspended = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, {
      body: { status_action: "suspended", reason: "chargeback" },
      headers: { "if-match": "1" },
    });
    expect(suspended.body.data).toMatchObject({
      status: "suspended",
      status_reason: "chargeback",
      version: 2,
    });
    const active = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, {
      body: { status_action: "active" },
      headers: { "if-match": '"2"' },
    });
    expect(active.body.data).toMatchObject({ status: "active", suspended_at: null, version: 3 });
    const events = await t.call("GET", "/mgmt/v1/events");
    expect(events.body.data.map((e: { type: string }) => e.type).slice(0, 3)).toEqual([
      "license.reinstated",
      "license.suspended",
      "license.created",
    ]);
  });

  test("suspending a suspended license with another reason replaces the reason as a license.updated change", async () => {
    const id = (await create(base())).body.data.public_id;
    const suspend = (body: Record<string, unknown>) =>
      t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { status_action: "suspended", ...body } });
    expect((await suspend({ reason: "chargeback" })).body.data).toMatchObject({ version: 2 });
    const suspendedAt = (await t.call("GET", `/mgmt/v1/licenses/${id}`)).body.data.suspended_at;

    const changed = await suspend({ reason: "fraud review" });
    expect(changed.status).toBe(200);
    expect(changed.body.data).toMatchObject({
      status: "suspended",
      status_reason: "fraud review",
      suspended_at: suspendedAt,
      version: 3,
    });
    const events = (await t.call("GET", "/mgmt/v1/events")).body.data;
    expect(events.slice(0, 2).map((e: { type: string; data: unknown }) => [e.type, e.data])).toEqual([
      ["license.updated", { changes: ["status_reason"] }],
      ["license.suspended", { reason: "chargeback" }],
    ]);
  });

  test("status_action active on an active license with a reason records that reason as a license.updated change", async () => {
    const id = (await create(base())).body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, {
      body: { status_action: "active", reason: "checked by support" },
    });
    expect(response.body.data).toMatchObject({
      status: "active",
      status_reason: "checked by support",
      version: 2,
    });
    expect((await t.call("GET", "/mgmt/v1/events")).body.data[0]).toMatchObject({
      type: "license.updated",
      data: { changes: ["status_reason"] },
    });
  });

  test("suspending a suspended license again with the same reason, or none, changes nothing and records nothing", async () => {
    const id = (await create(base())).body.data.public_id;
    const suspend = (body: Record<string, unknown>) =>
      t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { status_action: "suspended", ...body } });
    await suspend({ reason: "chargeback" });
    for (const body of [{ reason: "chargeback" }, {}]) {
      const again = await suspend(body);
      expect(again.status).toBe(200);
      expect(again.body.data).toMatchObject({ status_reason: "chargeback", version: 2 });
    }
    const types = (await t.call("GET", "/mgmt/v1/events")).body.data.map((e: { type: string }) => e.type);
    expect(types).toEqual(["license.suspended", "license.created"]);
  });

  test("an expired license is resumed by extending its expiry; its status reads expired until then", async () => {
    const at = new Date(t.clock.now().getTime() + DAY).toISOString();
    const id = (await create({ ...base(), expires_at: at })).body.data.public_id;
    t.clock.advance(2 * 86_400);
    expect((await t.call("GET", `/mgmt/v1/licenses/${id}`)).body.data.status).toBe("expired");
    const refused = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { status_action: "active" } });
    expect(refused.status).toBe(422);
    expect(refused.body.error).toMatchObject({
      code: "INVALID_TRANSITION",
      details: { from: "expired", to: "active" },
    });
    const later = new Date(t.clock.now().getTime() + 30 * DAY).toISOString();
    const resumed = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, {
      body: { status_action: "active", expires_at: later },
    });
    expect(resumed.body.data).toMatchObject({ status: "active", expires_at: later });
  });

  test("revoking is terminal: 204, then every change answers 422", async () => {
    const id = (await create(base())).body.data.public_id;
    expect((await t.call("DELETE", `/mgmt/v1/licenses/${id}`)).status).toBe(204);
    expect((await t.call("GET", `/mgmt/v1/licenses/${id}`)).body.data.status).toBe("revoked");
    const reinstate = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { status_action: "active" } });
    expect(reinstate.status).toBe(422);
    expect((await t.call("DELETE", `/mgmt/v1/licenses/${id}`)).status).toBe(204);
  });

  test("converting a trial keeps the key and moves it to the full policy", async () => {
    const trialPolicy = f.policy({
      productId,
      licenseType: "trial",
      trialDays: 14,
      entitlements: { export: false },
    });
    const subPolicy = f.policy({ productId, licenseType: "subscription", billingCycle: "yearly" });
    const trial = (await create({ product_id: productId, policy_id: trialPolicy.id })).body.data;
    const response = await t.call("POST", `/mgmt/v1/licenses/${trial.public_id}/convert-trial`, {
      body: { target_policy_id: subPolicy.id, entitlement_overrides: { seats: 10 } },
    });
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({
      key: trial.key,
      policy_id: subPolicy.id,
      license_type: "subscription",
      entitlement_overrides: { seats: 10 },
      version: 2,
    });
    expect(response.body.data.converted_at).not.toBeNull();
    expect(new Date(response.body.data.expires_at).getTime()).toBeGreaterThan(
      new Date(trial.expires_at).getTime(),
    );
  });
});

describe("concurrency tokens", () => {
  test("a PATCH that resends current values changes nothing and keeps the version", async () => {
    const id = (await create({ ...base(), metadata: { a: 1, b: [1, 2] }, max_machines: 3 })).body.data
      .public_id;
    for (const body of [
      { metadata: { b: [1, 2], a: 1 } },
      { max_machines_override: 3 },
      { renewal_authority: "vendor" },
    ]) {
      const response = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body });
      expect(response.status).toBe(200);
      expect(response.body.data.version).toBe(1);
    }
    const events = await t.call("GET", "/mgmt/v1/events");
    expect(events.body.data.filter((e: { type: string }) => e.type === "license.updated")).toHaveLength(0);
  });

  test("audit events name changed fields as the API does", async () => {
    const id = (await create(base())).body.data.public_id;
    await t.call("PATCH", `/mgmt/v1/licenses/${id}`, {
      body: { max_machines_override: 4, metadata: { k: "v" } },
    });
    const updated = (await t.call("GET", "/mgmt/v1/events")).body.data[0];
    expect(updated).toMatchObject({
      type: "license.updated",
      data: { changes: ["max_machines_override", "metadata"] },
    });
  });

  test("If-Match * matches any version", async () => {
    const id = (await create(base())).body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, {
      body: { metadata: { a: 1 } },
      headers: { "if-match": "*" },
    });
    expect(response.body.data.version).toBe(2);
  });

  test("convert-trial honours If-Match: a stale version answers 409 and converts nothing", async () => {
    const trialPolicy = f.policy({ productId, licenseType: "trial", trialDays: 7 });
    const subPolicy = f.policy({ productId, licenseType: "subscription", billingCycle: "yearly" });
    const trial = (await create({ product_id: productId, policy_id: trialPolicy.id })).body.data.public_id;
    await t.call("PATCH", `/mgmt/v1/licenses/${trial}`, { body: { metadata: { touched: true } } });
    const stale = await t.call("POST", `/mgmt/v1/licenses/${trial}/convert-trial`, {
      body: { target_policy_id: subPolicy.id },
      headers: { "if-match": "1" },
    });
    expect(stale.status).toBe(409);
    expect((await t.call("GET", `/mgmt/v1/licenses/${trial}`)).body.data.license_type).toBe("trial");
  });
});

describe("errors", () => {
  test("an empty customer_id, an impossible date and a bad entitlement name answer 422", async () => {
    for (const [body, field] of [
      [{ ...base(), customer_id: "" }, "customer_id"],
      [{ ...base(), expires_at: "2030-02-31T00:00:00Z" }, "expires_at"],
      [{ ...base(), expires_at: "2030-06-30T24:00:00Z" }, "expires_at"],
      [{ ...base(), expires_at: "2030-01-01" }, "expires_at"],
      [{ ...base(), entitlements: { "BAD NAME!!": true } }, "entitlements.BAD NAME!!"],
    ] as const) {
      const response = await create(body);
      expect(response.status).toBe(422);
      expect(response.body.error.details.errors[field]).toBeDefined();
    }
  });

  test("references that do not fit answer 422 keyed by field", async () => {
    const otherProduct = f.catalog().policy.id;
    const retired = f.policy({ productId, status: "retired" }).id;
    const archivedCustomer = f.customer({ status: "archived" }).id;
    for (const [body, field] of [
      [{ product_id: productId }, "policy_id"],
      [{ ...base(), policy_id: otherProduct }, "policy_id"],
      [{ ...base(), policy_id: retired }, "policy_id"],
      [{ ...base(), customer_id: "cus_01M81Z00000000000000000000" }, "customer_id"],
      [{ ...base(), customer_id: archivedCustomer }, "customer_id"],
      [{ ...base(), license_type: "trial" }, "license_type"],
    ] as const) {
      const response = await create(body);
      expect(response.status).toBe(422);
      expect(response.body.error.details.errors[field]).toBeDefined();
    }
    expect(t.deps.sqlite.query("SELECT count(*) AS n FROM licenses").get()).toEqual({ n: 0 });
  });

  test("overrides above the policy's bound of 1,000,000 answer 422 by field and change nothing", async () => {
    for (const field of ["max_machines", "max_concurrent", "license_unit_limit_override"]) {
      const response = await create({ ...base(), [field]: 1_000_001 });
      expect(response.status).toBe(422);
      expect(Object.keys(response.body.error.details.errors)).toEqual([field]);
    }
    expect(t.deps.sqlite.query("SELECT count(*) AS n FROM licenses").get()).toEqual({ n: 0 });
    const top = {
      max_machines: 1_000_000,
      max_concurrent: 1_000_000,
      license_unit_limit_override: 1_000_000,
    };
    const license = (await create({ ...base(), ...top })).body.data;
    expect(license).toMatchObject({ max_machines: 1_000_000, max_concurrent: 1_000_000, version: 1 });
    for (const field of ["max_machines_override", "max_concurrent_override", "license_unit_limit_override"]) {
      const response = await t.call("PATCH", `/mgmt/v1/licenses/${license.public_id}`, {
        body: { [field]: 1_000_001 },
      });
      expect(response.status).toBe(422);
      expect(Object.keys(response.body.error.details.errors)).toEqual([field]);
    }
    expect((await t.call("GET", `/mgmt/v1/licenses/${license.public_id}`)).body.data).toEqual(license);
  });

  test("a license for an archived product answers 409 PRODUCT_ARCHIVED", async () => {
    const archived = f.product({ status: "archived" });
    const policy = f.policy({ productId: archived.id });
    const response = await create({ product_id: archived.id, policy_id: policy.id });
    expect(response.status).toBe(409);
    expect(response.body.error.code).toBe("PRODUCT_ARCHIVED");
  });

  test("expiry values that cannot hold answer 422", async () => {
    const now = t.clock.now().getTime();
    const differ = await create({
      ...base(),
      expires_at: new Date(now + DAY).toISOString(),
      expiry: new Date(now + 2 * DAY).toISOString(),
    });
    expect(differ.status).toBe(422);
    const past = await create({ ...base(), expires_at: new Date(now - 1000).toISOString() });
    expect(past.body.error.details.errors.expires_at).toEqual(["must be in the future"]);
    t.workspace.setPlan("free");
    const far = await create({ ...base(), expires_at: new Date(now + 400 * DAY).toISOString() });
    expect(far.status).toBe(422);
    expect(far.body.error.details.errors.expires_at[0]).toContain("license_duration_max_sec");
  });

  test("the plan's trial allowance refuses a trial license with 409 PLAN_QUOTA_EXCEEDED", async () => {
    t.workspace.setPlan("free");
    const trialPolicy = f.policy({ productId, licenseType: "trial", trialDays: 7 });
    const response = await create({ product_id: productId, policy_id: trialPolicy.id });
    expect(response.status).toBe(409);
    expect(response.body.error).toMatchObject({
      code: "PLAN_QUOTA_EXCEEDED",
      details: { quota: "trial_licenses", limit: 0 },
    });
  });

  test("the plan's license allowance counts licenses that are not revoked", async () => {
    t.workspace.setPlan("free");
    const limit = t.workspace.plan().quotas.licenses?.limit ?? 0;
    for (let i = 0; i < limit; i++) f.license({ productId, policyId });
    const full = await create(base());
    expect(full.status).toBe(409);
    expect(full.body.error.details.quota).toBe("licenses");
    const one = t.deps.sqlite.query<{ id: string }, []>("SELECT id FROM licenses LIMIT 1").get();
    await t.call("DELETE", `/mgmt/v1/licenses/${one?.id}`);
    expect((await create(base())).status).toBe(201);
  });

  test("a stale If-Match returns 409 and changes nothing", async () => {
    const id = (await create(base())).body.data.public_id;
    await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { metadata: { a: 1 } } });
    const stale = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, {
      body: { status_action: "suspended" },
      headers: { "if-match": "1" },
    });
    expect(stale.status).toBe(409);
    expect((await t.call("GET", `/mgmt/v1/licenses/${id}`)).body.data).toMatchObject({
      status: "active",
      version: 2,
    });
  });

  test("a reason without a status_action, and more than 50 metadata keys, answer 422", async () => {
    const id = (await create(base())).body.data.public_id;
    const reason = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { reason: "why" } });
    expect(reason.body.error.details.errors.reason).toBeDefined();
    const metadata = Object.fromEntries(Array.from({ length: 51 }, (_, i) => [`k${i}`, i]));
    const big = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { metadata } });
    expect(big.status).toBe(422);
  });

  test("only a trial converts, and only to a full policy of the same product", async () => {
    const full = (await create(base())).body.data.public_id;
    const notTrial = await t.call("POST", `/mgmt/v1/licenses/${full}/convert-trial`, {
      body: { target_policy_id: policyId },
    });
    expect(notTrial.status).toBe(422);
    expect(notTrial.body.error.code).toBe("INVALID_TRANSITION");
    const trialPolicy = f.policy({ productId, licenseType: "trial", trialDays: 7 });
    const trial = (await create({ product_id: productId, policy_id: trialPolicy.id })).body.data.public_id;
    const toTrial = await t.call("POST", `/mgmt/v1/licenses/${trial}/convert-trial`, {
      body: { target_policy_id: trialPolicy.id },
    });
    expect(toTrial.body.error.details.errors.target_policy_id).toBeDefined();
    const foreign = f.catalog().policy.id;
    const toForeign = await t.call("POST", `/mgmt/v1/licenses/${trial}/convert-trial`, {
      body: { target_policy_id: foreign },
    });
    expect(toForeign.body.error.details.errors.target_policy_id).toBeDefined();
    expect((await t.call("GET", `/mgmt/v1/licenses/${trial}`)).body.data.license_type).toBe("trial");
  });
});
