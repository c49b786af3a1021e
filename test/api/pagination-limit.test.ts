import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * `limit` is plain decimal digits, once: anything else is malformed (400, as a bad cursor is),
 * and only a well-formed number outside 1..200 is a value out of range (422).
 */
let t: TestContext;
beforeAll(() => {
  t = createTestContext();
  const f = factories(t);
  for (let i = 0; i < 12; i++) f.product({ name: `P${i}` });
});
afterAll(() => t.close());

const MALFORMED = ["0x10", "1e1", "%2B5", "+5", "%205", "5.0", "-1", "1_0", "abc", "", "%EF%BC%95"];

/** Every list route, with `x` for each path parameter. */
const listRoutes = () =>
  (t.app.routes as { method: string; path: string; hooks: { query?: { properties?: object } } }[])
    .filter(
      (route) =>
        route.method === "GET" && route.hooks.query?.properties && "limit" in route.hooks.query.properties,
    )
    .map((route) => route.path.replace(/:[A-Za-z_]+/g, "x"));

const get = (query: string) => t.call("GET", `/mgmt/v1/products?${query}`);

describe("limit", () => {
  test("a caller without the list's scope, or without a key, hears 403 or 401 whatever limit it sends", async () => {
    const writer = t.apiKeys.create({ environment: "live", scopes: ["products:write"], name: "no read" });
    for (const limit of ["0x10", "500", "1&limit=2"]) {
      const path = `/mgmt/v1/products?limit=${limit}`;
      const unscoped = await t.call("GET", path, { key: writer.apiKey });
      const anonymous = await t.call("GET", path, { key: null });
      expect([unscoped.status, unscoped.body.error.code, anonymous.status]).toEqual([
        403,
        "INSUFFICIENT_SCOPE",
        401,
      ]);
    }
  });

  test("a limit in anything but plain decimal digits answers 400 INVALID_REQUEST, like a forged cursor", async () => {
    for (const limit of MALFORMED) {
      const response = await get(`limit=${limit}`);
      expect({ limit, status: response.status, code: response.body.error?.code }).toEqual({
        limit,
        status: 400,
        code: "INVALID_REQUEST",
      });
    }
    const cursor = await get("cursor=garbage");
    expect(cursor.status).toBe(400);
    expect(cursor.body.error.code).toBe("INVALID_REQUEST");
  });

  test("limit, cursor or a filter sent twice answers 400 instead of taking the last", async () => {
    const first = await get("limit=2");
    const next = first.body.pagination.next_cursor as string;
    const product = first.body.data[0].public_id as string;
    for (const query of [
      "limit=1&limit=2",
      "limit=2&limit=2",
      `cursor=${next}&cursor=${next}`,
      `status=active&status=archived`,
    ]) {
      const response = await get(query);
      expect({ query, status: response.status }).toEqual({ query, status: 400 });
      expect(response.body.error.code).toBe("INVALID_REQUEST");
    }
    const licenses = await t.call("GET", `/mgmt/v1/licenses?product_id=${product}&product_id=prod_other`);
    expect([licenses.status, licenses.body.error.code]).toEqual([400, "INVALID_REQUEST"]);
    expect((await t.call("GET", `/mgmt/v1/licenses?product_id=${product}`)).status).toBe(200);
  });

  test("an unknown query parameter answers 422 naming it as a query parameter, not as a body field", async () => {
    const response = await t.call("GET", "/mgmt/v1/licenses?colour=red");
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors).toEqual({ colour: ["is not a known query parameter"] });
  });

  test("plain digits still page: leading zeros are allowed, and 0 or 201 stay 422 out of range", async () => {
    expect((await get("limit=05")).body.data).toHaveLength(5);
    expect((await get("limit=200")).body.data).toHaveLength(12);
    for (const limit of ["0", "201", "99999999999999999999"]) {
      const response = await get(`limit=${limit}`);
      expect({ limit, status: response.status }).toEqual({ limit, status: 422 });
      expect(response.body.error.details.errors.limit).toBeDefined();
    }
  });

  test("every list route refuses a malformed or repeated limit the same way", async () => {
    const routes = listRoutes();
    expect(routes.length).toBeGreaterThanOrEqual(14);
    for (const path of routes) {
      for (const query of ["limit=0x10", "limit=1&limit=2"]) {
        const response = await t.call("GET", `${path}?${query}`);
        expect({ path, query, status: response.status }).toEqual({ path, query, status: 400 });
      }
    }
  });

  test("a caller without a key still hears 401 first, and routes without paging ignore limit as before", async () => {
    expect((await t.call("GET", "/mgmt/v1/products?limit=0x10", { key: null })).status).toBe(401);
    expect((await t.call("GET", "/mgmt/v1/plan?limit=0x10")).status).toBe(200);
  });
});
