import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { FEATURES } from "../../src/domain/plans.ts";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

describe("audit events", () => {
  test("every change is recorded, newest first, with the acting key and the request id", async () => {
    const product = await t.call("POST", "/mgmt/v1/products", {
      body: { name: "A", code: "a", environment: "live" },
      headers: t.idem(),
    });
    const productId = product.body.data.public_id;
    const policy = await t.call("POST", "/mgmt/v1/policies", {
      body: { product_id: productId, name: "P" },
      headers: t.idem(),
    });
    const customer = await t.call("POST", "/mgmt/v1/customers", { body: { name: "C" }, headers: t.idem() });
    const license = await t.call("POST", "/mgmt/v1/licenses", {
      body: { product_id: productId, policy_id: policy.body.data.public_id },
      headers: t.idem(),
    });
    await t.call("PATCH", `/mgmt/v1/products/${productId}`, { body: { name: "B" } });
    await t.call("PATCH", `/mgmt/v1/customers/${customer.body.data.public_id}`, { body: { notes: "n" } });
    await t.call("DELETE", `/mgmt/v1/licenses/${license.body.data.public_id}`);
    await t.call("DELETE", `/mgmt/v1/policies/${policy.body.data.public_id}`);
    await t.call("DELETE", `/mgmt/v1/customers/${customer.body.data.public_id}`);
    await t.call("DELETE", `/mgmt/v1/products/${productId}`);
    await t.call("POST", "/mgmt/v1/resellers", { body: { name: "R" } });

    const events = await t.call("GET", "/mgmt/v1/events?limit=200");
    expect(events.body.data.map((e: { type: string }) => e.type)).toEqual([
      "reseller.created",
      "product.archived",
      "customer.archived",
      "policy.retired",
      "license.revoked",
      "customer.updated",
      "product.updated",
      "license.created",
      "customer.created",
      "policy.created",
      "product.created",
    ]);
    const created = events.body.data.at(-1);
    const keyId = t.apiKeys.authenticate(t.keys.live)?.id;
    expect(created).toMatchObject({
      actor: { type: "api_key", id: keyId, name: "live key" },
      target: { type: "product", id: productId, environment: "live" },
      request_id: product.headers.get("x-request-id"),
    });
  });

  test("a key sees only its own environment's events, and refusals record nothing", async () => {
    await t.call("POST", "/mgmt/v1/products", {
      body: { name: "A", code: "a", environment: "live" },
      headers: t.idem(),
    });
    await t.call("POST", "/mgmt/v1/products", {
      body: { name: "", code: "b", environment: "live" },
      headers: t.idem(),
    });
    expect((await t.call("GET", "/mgmt/v1/events", { key: t.keys.test })).body.data).toHaveLength(0);
    expect((await t.call("GET", "/mgmt/v1/events")).body.data).toHaveLength(1);
  });
});

describe("command-line changes", () => {
  test("keys and plan changes made from the command line are audited with a cli actor", async () => {
    const actor = { type: "cli" as const, id: "ops" };
    const created = t.apiKeys.create({ environment: "test", scopes: ["products:read"], name: "ci" }, actor);
    t.apiKeys.revoke(created.id, actor);
    t.workspace.setPlan("business", actor);
    const test = (await t.call("GET", "/mgmt/v1/events", { key: t.keys.test })).body.data;
    expect(test.map((e: { type: string }) => e.type)).toEqual([
      "workspace.plan_changed",
      "api_key.revoked",
      "api_key.created",
    ]);
    expect(test[2]).toMatchObject({
      actor,
      target: { type: "api_key", id: created.id, environment: "test" },
    });
    const live = (await t.call("GET", "/mgmt/v1/events")).body.data;
    expect(live.map((e: { type: string }) => e.type)).toEqual(["workspace.plan_changed"]);
  });
});

describe("plan", () => {
  test("the default self-hosted plan has every feature and reports license usage", async () => {
    const f = factories(t);
    const { product, policy } = f.catalog();
    f.license({ productId: product.id, policyId: policy.id });
    f.license({ productId: product.id, policyId: policy.id, status: "revoked" });
    const response = await t.call("GET", "/mgmt/v1/plan");
    expect(response.status).toBe(200);
    const data = response.body.data;
    expect(data.plan).toMatchObject({ code: "self_hosted", trial: false, ends_at: null });
    expect(data.unavailable_features).toEqual([]);
    expect(data.quotas.licenses).toMatchObject({ used: 1, remaining: data.quotas.licenses.limit - 1 });
    expect(Object.keys(data.policy_constraints).sort()).toEqual([
      "activation_sync_min_sec",
      "cert_ttl_max_sec",
      "floating_lease_ttl_min_sec",
      "floating_sync_min_sec",
      "revocation_exposure_max_sec",
    ]);
    expect(data.revocation_exposure_max_sec_by_plan.self_hosted).toBe(
      data.policy_constraints.revocation_exposure_max_sec,
    );
  });

  test("a smaller plan lists what it lacks with the cheapest plan that has it", async () => {
    t.workspace.setPlan("free");
    const data = (await t.call("GET", "/mgmt/v1/plan")).body.data;
    const keys = data.unavailable_features.map((f: { key: string }) => f.key).sort();
    expect(keys).toEqual(FEATURES.filter((f) => f !== "offline_packages").sort());
    expect(data.unavailable_features.find((f: { key: string }) => f.key === "sealed_files")).toEqual({
      key: "sealed_files",
      minimum_plan: "business",
      minimum_plan_name: "Business",
    });
  });
});

describe("usage report", () => {
  test("active licenses count this environment's licenses that are neither revoked, suspended nor expired", async () => {
    const f = factories(t);
    const { product, policy } = f.catalog();
    f.license({ productId: product.id, policyId: policy.id });
    f.license({ productId: product.id, policyId: policy.id, status: "revoked", revokedAt: t.clock.now() });
    f.license({
      productId: product.id,
      policyId: policy.id,
      status: "suspended",
      suspendedAt: t.clock.now(),
    });
    f.license({
      productId: product.id,
      policyId: policy.id,
      expiresAt: new Date(t.clock.now().getTime() - 1000),
    });
    const test = f.catalog("test");
    f.license({ productId: test.product.id, policyId: test.policy.id, environment: "test" });
    const response = await t.call("GET", "/mgmt/v1/reports/usage");
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({ active_licenses: 1, new_activations: 0 });
    expect(response.body.data.period.label).toBe(t.clock.now().toISOString().slice(0, 7));
  });

  test("a past month counts licenses as they stood at its end", async () => {
    const f = factories(t);
    const { product, policy } = f.catalog();
    const { row } = f.license({ productId: product.id, policyId: policy.id });
    // Into the month after next: the license lived through the whole previous month, then is revoked.
    const now = t.clock.now();
    const nextNextMonth = Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 2, 2);
    t.clock.advance(Math.ceil((nextNextMonth - now.getTime()) / 1000));
    await t.call("DELETE", `/mgmt/v1/licenses/${row.id}`);
    const previous = await t.call("GET", "/mgmt/v1/reports/usage?period=previous_month");
    expect(previous.body.data.active_licenses).toBe(1);
    const current = await t.call("GET", "/mgmt/v1/reports/usage");
    expect(current.body.data.active_licenses).toBe(0);
  });

  test("every bad query answers 400 as the spec lists, never 422: an unknown parameter, an overlong or bracketed period", async () => {
    for (const query of [
      "colour=red",
      "period=current_month&x",
      `period=${"2".repeat(33)}`,
      `period=${"2".repeat(20)}`,
      "period[]=2026-01",
      "period[0]=previous_month",
      "=x",
    ]) {
      const response = await t.call("GET", `/mgmt/v1/reports/usage?${query}`);
      expect({ query, status: response.status }).toEqual({ query, status: 400 });
      expect(response.body.error.code).toBe("INVALID_REQUEST");
    }
    const unknown = await t.call("GET", "/mgmt/v1/reports/usage?colour=red");
    expect(unknown.body.error.details.errors).toEqual({ colour: ["is not a known query parameter"] });
    // A caller without the scope learns nothing about the query: 403 first.
    const unscoped = t.keyFor("live", ["licenses:read"]);
    const refused = await t.call("GET", "/mgmt/v1/reports/usage?colour=red", { key: unscoped });
    expect(refused.status).toBe(403);
  });

  test("an unknown or future period answers 400", async () => {
    for (const period of ["last_week", "2026-13", "2999-01", "0000-01"]) {
      const response = await t.call("GET", `/mgmt/v1/reports/usage?period=${period}`);
      expect(response.status).toBe(400);
      expect(response.body.error.code).toBe("INVALID_REQUEST");
    }
  });
});
