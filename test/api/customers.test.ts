import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const create = (body: Record<string, unknown>, key?: string) =>
  t.call("POST", "/mgmt/v1/customers", { body, key, headers: t.idem() });

/** A customer holding a license in `environment`. */
function customerWithLicense(environment: "live" | "test") {
  const f = factories(t);
  const customer = f.customer();
  const { product, policy } = f.catalog(environment);
  f.license({ productId: product.id, policyId: policy.id, environment, customerId: customer.id });
  return customer;
}

describe("happy path", () => {
  test("a customer needs only a name or an email", async () => {
    const byName = await create({ name: "Ada" });
    expect(byName.status).toBe(201);
    expect(byName.body.data).toMatchObject({ name: "Ada", email: null, status: "active" });
    const byEmail = await create({ email: "ada@example.com" });
    expect(byEmail.status).toBe(201);
    expect(byEmail.headers.get("etag")).toMatch(/^"[0-9a-f]{24}"$/);
  });

  test("customers are shared: a test key sees and changes customers made with a live key", async () => {
    const id = (await create({ name: "Shared" })).body.data.public_id;
    const seen = await t.call("GET", "/mgmt/v1/customers", { key: t.keys.test });
    expect(seen.body.data.map((c: { public_id: string }) => c.public_id)).toContain(id);
    const changed = await t.call("PATCH", `/mgmt/v1/customers/${id}`, {
      key: t.keys.test,
      body: { notes: "ok" },
    });
    expect(changed.status).toBe(200);
  });

  test("an update with the ETag changes only the fields sent", async () => {
    const created = await create({ name: "Ada", email: "ada@example.com" });
    const id = created.body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/customers/${id}`, {
      body: { external_ref: "crm-1" },
      headers: { "if-match": created.headers.get("etag") ?? "" },
    });
    expect(response.body.data).toMatchObject({
      name: "Ada",
      email: "ada@example.com",
      external_ref: "crm-1",
    });
  });

  test("the list can be filtered by email, case-insensitively", async () => {
    await create({ email: "Ada@Example.com" });
    await create({ email: "bob@example.com" });
    const response = await t.call("GET", "/mgmt/v1/customers?email=ada@example.com");
    expect(response.body.data).toHaveLength(1);
  });

  test("the email filter is normalised as stored addresses are: an international domain finds its punycode", async () => {
    const stored = (await create({ email: "a@Bücher.example" })).body.data;
    expect(stored.email).toBe("a@xn--bcher-kva.example");
    await create({ email: "b@xn--bcher-kva.example" });
    for (const typed of [
      "a@Bücher.example",
      "a@BÜCHER.EXAMPLE",
      "a@Bu\u0308cher.example",
      "A@xn--bcher-kva.example",
    ]) {
      const response = await t.call("GET", `/mgmt/v1/customers?email=${encodeURIComponent(typed)}`);
      expect({ typed, found: response.body.data.map((c: { public_id: string }) => c.public_id) }).toEqual({
        typed,
        found: [stored.public_id],
      });
    }
    // A customer stored with its address as typed, before addresses were normalised, is still found by that text.
    const legacy = factories(t).customer({ email: "old@Bücher.example" });
    const response = await t.call(
      "GET",
      `/mgmt/v1/customers?email=${encodeURIComponent("old@Bücher.example")}`,
    );
    expect(response.body.data.map((c: { public_id: string }) => c.public_id)).toEqual([legacy.id]);
  });

  test("filtering by email looks the address up in an index instead of reading every customer", async () => {
    await create({ email: "Ada@Example.com" });
    const { result: response, sql } = await sqlPreparedDuring(t.deps.sqlite, () =>
      t.call("GET", "/mgmt/v1/customers?email=ADA@example.com"),
    );
    expect(response.body.data).toHaveLength(1);
    const filtered = sql.find((text) => /from "customers" where lower/i.test(text));
    expect(filtered).toBeDefined();
    expect(queryPlan(t.deps.sqlite, filtered as string)).toMatch(
      /^SEARCH customers USING INDEX \w+ \(<expr>=\?\)/,
    );
  });

  test("archiving answers 204 and is harmless to repeat", async () => {
    const id = (await create({ name: "Gone" })).body.data.public_id;
    expect((await t.call("DELETE", `/mgmt/v1/customers/${id}`)).status).toBe(204);
    expect((await t.call("DELETE", `/mgmt/v1/customers/${id}`)).status).toBe(204);
    expect((await t.call("GET", `/mgmt/v1/customers/${id}`)).body.data.status).toBe("archived");
  });
});

describe("errors", () => {
  test("neither name nor email answers 422 naming both", async () => {
    const response = await create({ notes: "who?" });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors).sort()).toEqual(["email", "name"]);
  });

  test("clearing the last of name and email answers 422", async () => {
    const id = (await create({ name: "Ada" })).body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/customers/${id}`, { body: { name: null } });
    expect(response.status).toBe(422);
  });

  test("a malformed email answers 422", async () => {
    const response = await create({ email: "not an email" });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.email).toBeDefined();
  });

  test("a stale ETag returns 409 and changes nothing", async () => {
    const created = await create({ name: "Ada" });
    const id = created.body.data.public_id;
    await t.call("PATCH", `/mgmt/v1/customers/${id}`, { body: { name: "Ada L." } });
    const stale = await t.call("PATCH", `/mgmt/v1/customers/${id}`, {
      body: { name: "Lost" },
      headers: { "if-match": created.headers.get("etag") ?? "" },
    });
    expect(stale.status).toBe(409);
    expect((await t.call("GET", `/mgmt/v1/customers/${id}`)).body.data.name).toBe("Ada L.");
  });

  test("a test key cannot change or archive a customer that holds a live license", async () => {
    const customer = customerWithLicense("live");
    const patch = await t.call("PATCH", `/mgmt/v1/customers/${customer.id}`, {
      key: t.keys.test,
      body: { notes: "x" },
    });
    expect(patch.status).toBe(403);
    expect(patch.body.error.code).toBe("ENVIRONMENT_MISMATCH");
    const del = await t.call("DELETE", `/mgmt/v1/customers/${customer.id}`, { key: t.keys.test });
    expect(del.status).toBe(403);
    const after = await t.call("GET", `/mgmt/v1/customers/${customer.id}`, { key: t.keys.test });
    expect(after.body.data).toMatchObject({ status: "active", notes: null });
  });

  test("a live key may change a customer that holds a live license, and a test key one with only test licenses", async () => {
    const live = customerWithLicense("live");
    expect((await t.call("PATCH", `/mgmt/v1/customers/${live.id}`, { body: { notes: "x" } })).status).toBe(
      200,
    );
    const testOnly = customerWithLicense("test");
    expect((await t.call("DELETE", `/mgmt/v1/customers/${testOnly.id}`, { key: t.keys.test })).status).toBe(
      204,
    );
  });

  test("an archived customer cannot change", async () => {
    const id = (await create({ name: "Gone" })).body.data.public_id;
    await t.call("DELETE", `/mgmt/v1/customers/${id}`);
    const response = await t.call("PATCH", `/mgmt/v1/customers/${id}`, { body: { name: "Back" } });
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("INVALID_TRANSITION");
  });
});
