import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ApiError } from "../../src/http/errors.ts";
import { IF_MATCH_MAX_LENGTH, parseIfMatch } from "../../src/http/preconditions.ts";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { seedResources } from "./route-table.ts";

/**
 * One If-Match parser for every route (RFC 9110 §13.1.1): `*`, or a comma-separated list of
 * entity-tags compared strongly, weak tags never matching; a malformed header is 400. The shared
 * suite (security.test.ts) runs the same checks on every route that takes If-Match; these are the
 * cases the fuzz review found, one resource at a time.
 */
let t: TestContext;
let f: ReturnType<typeof factories>;
beforeEach(() => {
  t = createTestContext();
  f = factories(t);
});
afterEach(() => t.close());

const auditCount = () =>
  (t.deps.sqlite.query("SELECT count(*) AS n FROM audit_events").get() as { n: number }).n;

async function product() {
  const created = await t.call("POST", "/mgmt/v1/products", {
    body: { name: "App", code: `app-${Math.random().toString(36).slice(2, 8)}`, environment: "live" },
    headers: t.idem(),
  });
  return created.body.data.public_id as string;
}

describe("products and licenses (their version)", () => {
  test("a weak If-Match never matches: 409 and the product is unchanged", async () => {
    const id = await product();
    const events = auditCount();
    const response = await t.call("PATCH", `/mgmt/v1/products/${id}`, {
      body: { name: "Renamed" },
      headers: { "if-match": 'W/"1"' },
    });
    expect(response.status).toBe(409);
    expect(response.body.error).toMatchObject({ code: "VERSION_CONFLICT", details: { current_etag: '"1"' } });
    expect((await t.call("GET", `/mgmt/v1/products/${id}`)).body.data).toMatchObject({
      name: "App",
      version: 1,
    });
    expect(auditCount()).toBe(events);
  });

  test("an unbalanced quote is malformed: 400, not version 1, and the product is unchanged", async () => {
    const id = await product();
    for (const ifMatch of ['"1', '1"', "W/1", '"1"x']) {
      const response = await t.call("PATCH", `/mgmt/v1/products/${id}`, {
        body: { name: "Renamed" },
        headers: { "if-match": ifMatch },
      });
      expect(response.status).toBe(400);
      expect(response.body.error).toMatchObject({ code: "INVALID_REQUEST", details: { if_match: ifMatch } });
    }
    expect((await t.call("GET", `/mgmt/v1/products/${id}`)).body.data).toMatchObject({
      name: "App",
      version: 1,
    });
  });

  test("a list holding the current version matches on products, as it does on policies and customers", async () => {
    const id = await product();
    const renamed = await t.call("PATCH", `/mgmt/v1/products/${id}`, {
      body: { name: "Renamed" },
      headers: { "if-match": '"999", "1"' },
    });
    expect(renamed.status).toBe(200);
    expect(renamed.headers.get("etag")).toBe('"2"');
    const archived = await t.call("DELETE", `/mgmt/v1/products/${id}`, {
      headers: { "if-match": '"1", "2"' },
    });
    expect(archived.status).toBe(204);
  });

  test("revoking with a stale version answers 409 and the license stays active; the current one revokes", async () => {
    const { product: p, policy } = f.catalog();
    const license = f.license({ productId: p.id, policyId: policy.id }).row;
    const path = `/mgmt/v1/licenses/${license.id}`;
    const events = auditCount();
    const stale = await t.call("DELETE", path, { headers: { "if-match": '"7"' } });
    expect(stale.status).toBe(409);
    expect(stale.body.error).toMatchObject({ code: "VERSION_CONFLICT", details: { current_etag: '"1"' } });
    expect((await t.call("GET", path)).body.data).toMatchObject({ status: "active", version: 1 });
    expect(auditCount()).toBe(events);
    expect((await t.call("DELETE", path, { headers: { "if-match": "1" } })).status).toBe(204);
    expect((await t.call("GET", path)).body.data).toMatchObject({ status: "revoked", version: 2 });
    // Repeating the revocation is harmless, but not with the tag it was revoked under.
    expect((await t.call("DELETE", path, { headers: { "if-match": '"2"' } })).status).toBe(204);
    expect((await t.call("DELETE", path, { headers: { "if-match": '"1"' } })).status).toBe(409);
  });
});

describe("policies and customers (their opaque ETag)", () => {
  test("a malformed If-Match answers 400, as on products, instead of being compared", async () => {
    const { policy } = f.catalog();
    const etag = (await t.call("GET", `/mgmt/v1/policies/${policy.id}`)).headers.get("etag") ?? "";
    for (const ifMatch of [etag.slice(0, -1), `*, ${etag}`, etag.slice(1, -1)]) {
      const response = await t.call("PATCH", `/mgmt/v1/policies/${policy.id}`, {
        body: { name: "Renamed" },
        headers: { "if-match": ifMatch },
      });
      expect(response.status).toBe(400);
      expect(response.body.error.code).toBe("INVALID_REQUEST");
    }
    expect((await t.call("GET", `/mgmt/v1/policies/${policy.id}`)).headers.get("etag")).toBe(etag);
  });

  test("archiving a customer with a stale ETag answers 409 and the customer stays active", async () => {
    const created = await t.call("POST", "/mgmt/v1/customers", { body: { name: "C" }, headers: t.idem() });
    const path = `/mgmt/v1/customers/${created.body.data.public_id}`;
    const etag = created.headers.get("etag") ?? "";
    expect(
      (await t.call("PATCH", path, { body: { notes: "n" }, headers: { "if-match": etag } })).status,
    ).toBe(200);
    const events = auditCount();
    const stale = await t.call("DELETE", path, { headers: { "if-match": etag } });
    expect(stale.status).toBe(409);
    expect((await t.call("GET", path)).body.data.status).toBe("active");
    expect(auditCount()).toBe(events);
    const current = (await t.call("GET", path)).headers.get("etag") ?? "";
    expect((await t.call("DELETE", path, { headers: { "if-match": current } })).status).toBe(204);
  });
});

describe("webhooks and resellers (now with an ETag)", () => {
  test("a webhook endpoint's create, get, change and rotation carry its ETag, and a stale one is refused", async () => {
    const created = await t.call("POST", "/mgmt/v1/webhooks", {
      body: { url: "https://hooks.example.com/in" },
    });
    const id = created.body.data.public_id;
    const etag = created.headers.get("etag");
    expect(etag).toMatch(/^"[0-9a-f]{24}"$/);
    expect((await t.call("GET", `/mgmt/v1/webhooks/${id}`)).headers.get("etag")).toBe(etag);
    const renamed = await t.call("PATCH", `/mgmt/v1/webhooks/${id}`, {
      body: { name: "Renamed" },
      headers: { "if-match": etag ?? "" },
    });
    expect(renamed.status).toBe(200);
    const next = renamed.headers.get("etag");
    expect(next).not.toBe(etag);
    const events = auditCount();
    for (const [method, path, body] of [
      ["PATCH", `/mgmt/v1/webhooks/${id}`, { name: "Again" }],
      ["POST", `/mgmt/v1/webhooks/${id}/rotate-secret`, {}],
      ["DELETE", `/mgmt/v1/webhooks/${id}`, undefined],
    ] as const) {
      const stale = await t.call(method, path, { body, headers: { "if-match": etag ?? "" } });
      expect(stale.status).toBe(409);
      expect(stale.body.error.details.current_etag).toBe(next);
    }
    expect((await t.call("GET", `/mgmt/v1/webhooks/${id}`)).body.data).toMatchObject({
      name: "Renamed",
      status: "active",
      secret_rotation: { scheduled: false },
    });
    expect(auditCount()).toBe(events);
    const rotated = await t.call("POST", `/mgmt/v1/webhooks/${id}/rotate-secret`, {
      body: {},
      headers: { "if-match": next ?? "" },
    });
    expect(rotated.status).toBe(200);
    expect(rotated.headers.get("etag")).toBe(
      (await t.call("GET", `/mgmt/v1/webhooks/${id}`)).headers.get("etag"),
    );
  });

  test("a reseller's create, get and change carry its ETag, and a stale one is refused", async () => {
    const created = await t.call("POST", "/mgmt/v1/resellers", { body: { name: "R" } });
    const id = created.body.data.public_id;
    const etag = created.headers.get("etag");
    expect(etag).toMatch(/^"[0-9a-f]{24}"$/);
    expect((await t.call("GET", `/mgmt/v1/resellers/${id}`)).headers.get("etag")).toBe(etag);
    const renamed = await t.call("PATCH", `/mgmt/v1/resellers/${id}`, {
      body: { name: "R2" },
      headers: { "if-match": etag ?? "" },
    });
    expect(renamed.status).toBe(200);
    expect(renamed.headers.get("etag")).not.toBe(etag);
    const events = auditCount();
    const stale = await t.call("PATCH", `/mgmt/v1/resellers/${id}`, {
      body: { name: "R3" },
      headers: { "if-match": etag ?? "" },
    });
    expect(stale.status).toBe(409);
    expect(stale.body.error.details.current_etag).toBe(renamed.headers.get("etag"));
    expect((await t.call("GET", `/mgmt/v1/resellers/${id}`)).body.data.name).toBe("R2");
    expect(auditCount()).toBe(events);
  });
});

describe("device blocks, license assignments and activations (no ETag)", () => {
  test("deleting one with any entity-tag answers 409 and deletes nothing; a malformed If-Match is 400; * deletes", async () => {
    const ids = seedResources(t).live;
    const blocked = async () =>
      (await t.call("GET", "/mgmt/v1/device-blocks")).body.data.some(
        (b: { id: string }) => b.id === ids.block,
      );
    const assigned = async () =>
      (await t.call("GET", `/mgmt/v1/licenses/${ids.license}/assignments`)).body.data.some(
        (a: { public_id: string; status: string }) => a.public_id === ids.assignment && a.status === "active",
      );
    const activationStatus = async () =>
      (await t.call("GET", `/mgmt/v1/activations/${ids.activation}`)).body.data.status;
    expect([await blocked(), await assigned(), await activationStatus()]).toEqual([true, true, "active"]);
    const paths = [
      `/mgmt/v1/device-blocks/${ids.block}`,
      `/mgmt/v1/license-assignments/${ids.assignment}`,
      `/mgmt/v1/activations/${ids.activation}`,
    ];
    const events = auditCount();
    for (const path of paths) {
      for (const ifMatch of ['"some-old-tag"', "1", 'W/"1"']) {
        const response = await t.call("DELETE", path, { headers: { "if-match": ifMatch } });
        expect({ path, ifMatch, status: response.status }).toEqual({ path, ifMatch, status: 409 });
        expect(response.body.error).toMatchObject({
          code: "VERSION_CONFLICT",
          details: { current_etag: null },
        });
      }
      const malformed = await t.call("DELETE", path, { headers: { "if-match": '"unbalanced' } });
      expect({ path, status: malformed.status }).toEqual({ path, status: 400 });
    }
    expect([await blocked(), await assigned(), await activationStatus()]).toEqual([true, true, "active"]);
    expect(auditCount()).toBe(events);
    for (const path of paths) {
      expect((await t.call("DELETE", path, { headers: { "if-match": "*" } })).status).toBe(204);
    }
    expect([await blocked(), await assigned(), await activationStatus()]).toEqual([
      false,
      false,
      "deactivated",
    ]);
  });
});

describe("a long header (the review's quadratic trim)", () => {
  test("a run of spaces before a stray character is malformed, and one around a list still parses", () => {
    const spaces = " \t".repeat(150);
    expect(() => parseIfMatch(`"a"${spaces}x`)).toThrow(ApiError);
    expect(parseIfMatch(`${spaces}"7",${spaces}"8"${spaces}`)).toEqual({
      any: false,
      strong: ['"7"', '"8"'],
    });
    expect(parseIfMatch(`${spaces}*${spaces}`)).toEqual({ any: true });
    expect(parseIfMatch(`${spaces}7${spaces}`)).toEqual({ any: false, strong: ['"7"'] });
  });

  test("a header over the limit is refused before it is parsed, even one that would match", async () => {
    const overLimit = `"1",${" ".repeat(IF_MATCH_MAX_LENGTH)}"2"`;
    // Well-formed (spaces between list elements are allowed): only its length refuses it.
    let refused: unknown;
    try {
      parseIfMatch(overLimit);
    } catch (error) {
      refused = error;
    }
    expect(refused).toBeInstanceOf(ApiError);
    expect((refused as ApiError).details).toEqual({ if_match_length: overLimit.length });
    const atLimit = `"1",${" ".repeat(IF_MATCH_MAX_LENGTH - 7)}"2"`;
    expect(atLimit.length).toBe(IF_MATCH_MAX_LENGTH);
    expect(parseIfMatch(atLimit)).toEqual({ any: false, strong: ['"1"', '"2"'] });

    const id = await product();
    const response = await t.call("PATCH", `/mgmt/v1/products/${id}`, {
      body: { name: "Renamed" },
      headers: { "if-match": overLimit },
    });
    expect(response.status).toBe(400);
    expect(response.body.error.code).toBe("INVALID_REQUEST");
    expect((await t.call("GET", `/mgmt/v1/products/${id}`)).body.data).toMatchObject({
      name: "App",
      version: 1,
    });
    const matched = await t.call("PATCH", `/mgmt/v1/products/${id}`, {
      body: { name: "Renamed" },
      headers: { "if-match": atLimit },
    });
    expect(matched.status).toBe(200);
  });

  test("the parser trims without a regular expression (a regex trim backtracks quadratically)", () => {
    const source = readFileSync(join(import.meta.dir, "../../src/http/preconditions.ts"), "utf8");
    expect(source).not.toMatch(/\.replace\(\s*\//);
  });
});
