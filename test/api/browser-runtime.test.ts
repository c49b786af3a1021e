import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";

/** GET/PATCH /mgmt/v1/products/{id}/browser-runtime (spec §4.3 rule 2). */
let t: TestContext;
let productId: string;

async function product(environment: "live" | "test" = "live") {
  const response = await t.call("POST", "/mgmt/v1/products", {
    key: environment === "live" ? t.keys.live : t.keys.test,
    body: { name: "Web", code: `web-${Math.random().toString(36).slice(2, 10)}`, environment },
    headers: t.idem(),
  });
  return response.body.data.public_id as string;
}

beforeEach(async () => {
  t = createTestContext();
  productId = await product();
});
afterEach(() => t.close());

const path = (id = productId) => `/mgmt/v1/products/${id}/browser-runtime`;
const patch = (body: unknown, options: { id?: string; key?: string; ifMatch?: string } = {}) =>
  t.call("PATCH", path(options.id), {
    body,
    key: options.key,
    headers: options.ifMatch === undefined ? {} : { "if-match": options.ifMatch },
  });
const settings = async (id = productId, key?: string) => (await t.call("GET", path(id), { key })).body.data;
const productVersion = async (id = productId, key?: string) =>
  (await t.call("GET", `/mgmt/v1/products/${id}`, { key })).body.data.version as number;
const updatedEvents = () =>
  t.deps.sqlite
    .query<{ data: string }, []>("SELECT data FROM audit_events WHERE type = 'product.updated' ORDER BY id")
    .all()
    .map((row) => JSON.parse(row.data));

describe("happy path", () => {
  test("a new product has the browser runtime disabled, no origins, and the product's version", async () => {
    const response = await t.call("GET", path());
    expect(response.status).toBe(200);
    expect(response.body.data).toEqual({
      product_id: productId,
      enabled: false,
      allowed_origins: [],
      version: 1,
    });
    expect(response.headers.get("etag")).toBe('"1"');
  });

  test("enabling with origins stores them, bumps the product's version and answers the new settings", async () => {
    const response = await patch(
      { enabled: true, allowed_origins: ["https://app.example.com", "https://example.org:8443"] },
      { ifMatch: "1" },
    );
    expect(response.status).toBe(200);
    expect(response.body.data).toEqual({
      product_id: productId,
      enabled: true,
      allowed_origins: ["https://app.example.com", "https://example.org:8443"],
      version: 2,
    });
    expect(response.headers.get("etag")).toBe('"2"');
    expect(await settings()).toEqual(response.body.data);
    expect(await productVersion()).toBe(2);
  });

  test("origins are stored in the form browsers send: lower case, punycode, no default port", async () => {
    const response = await patch({
      allowed_origins: ["HTTPS://App.Example.COM:443", "https://bücher.example", "https://EXAMPLE.net:0443"],
    });
    expect(response.status).toBe(200);
    expect(response.body.data.allowed_origins).toEqual([
      "https://app.example.com",
      "https://xn--bcher-kva.example",
      "https://example.net",
    ]);
  });

  test("allowed_origins replaces the whole list", async () => {
    await patch({ enabled: true, allowed_origins: ["https://a.example", "https://b.example"] });
    const response = await patch({ allowed_origins: ["https://c.example"] });
    expect(response.body.data.allowed_origins).toEqual(["https://c.example"]);
    expect(response.body.data.enabled).toBe(true);
  });

  test("disabling keeps the list, and enabling again brings it back unchanged", async () => {
    await patch({ enabled: true, allowed_origins: ["https://a.example"] });
    const off = await patch({ enabled: false });
    expect(off.body.data).toMatchObject({ enabled: false, allowed_origins: ["https://a.example"] });
    const on = await patch({ enabled: true });
    expect(on.body.data).toMatchObject({ enabled: true, allowed_origins: ["https://a.example"] });
  });

  test("the list can be cleared while the runtime is disabled", async () => {
    await patch({ enabled: true, allowed_origins: ["https://a.example"] });
    await patch({ enabled: false });
    const response = await patch({ allowed_origins: [] });
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({ enabled: false, allowed_origins: [] });
  });

  test("exactly 20 origins are accepted", async () => {
    const origins = Array.from({ length: 20 }, (_, i) => `https://app${i}.example.com`);
    const response = await patch({ enabled: true, allowed_origins: origins });
    expect(response.status).toBe(200);
    expect(response.body.data.allowed_origins).toEqual(origins);
  });

  test("hosts that are DNS names of letters, digits, hyphens and underscores, or IP addresses, are accepted", async () => {
    const origins = [
      "https://a-b.example.com",
      "https://build_42.internal.example",
      "https://xn--bcher-kva.example",
      "https://1st.example",
      `https://${"a".repeat(63)}.example.com`,
      "https://203.0.113.7",
      "https://[2001:db8::1]:8443",
    ];
    const response = await patch({ enabled: true, allowed_origins: origins });
    expect(response.body.error).toBeUndefined();
    expect(response.body.data.allowed_origins).toEqual(origins);
  });

  test("a test product also accepts http origins on loopback hosts", async () => {
    const testProduct = await product("test");
    const response = await patch(
      {
        enabled: true,
        allowed_origins: [
          "http://localhost:5173",
          "http://127.0.0.1:8080",
          "http://[::1]:3000",
          "http://127.1",
        ],
      },
      { id: testProduct, key: t.keys.test },
    );
    expect(response.status).toBe(200);
    expect(response.body.data.allowed_origins).toEqual([
      "http://localhost:5173",
      "http://127.0.0.1:8080",
      "http://[::1]:3000",
      "http://127.0.0.1",
    ]);
  });

  test("a change is audited as product.updated with what changed", async () => {
    await patch({ enabled: true, allowed_origins: ["https://a.example"] });
    await patch({ allowed_origins: ["https://b.example"] });
    const events = (await t.call("GET", "/mgmt/v1/events")).body.data.filter(
      (e: { type: string }) => e.type === "product.updated",
    );
    expect(events).toHaveLength(2);
    expect(events.map((e: { data: unknown }) => e.data)).toContainEqual({
      setting: "browser_runtime",
      changes: ["enabled", "allowed_origins"],
      enabled: true,
      allowed_origins_added: ["https://a.example"],
      allowed_origins_removed: [],
    });
    expect(events.map((e: { data: unknown }) => e.data)).toContainEqual({
      setting: "browser_runtime",
      changes: ["allowed_origins"],
      enabled: true,
      allowed_origins_added: ["https://b.example"],
      allowed_origins_removed: ["https://a.example"],
    });
    expect(events[0].target).toMatchObject({ type: "product", id: productId, environment: "live" });
    expect(events[0].actor).toMatchObject({ type: "api_key" });
  });

  test("resending the current settings changes nothing: same version, no audit event", async () => {
    const first = await patch({ enabled: true, allowed_origins: ["https://a.example"] });
    const again = await patch({ enabled: true, allowed_origins: ["HTTPS://A.example"] });
    expect(again.status).toBe(200);
    expect(again.body.data).toEqual(first.body.data);
    expect(updatedEvents()).toHaveLength(1);
  });
});

describe("validation", () => {
  const refusals: [string, string, RegExp][] = [
    ["a wildcard host", "https://*.example.com", /wildcard/],
    ["a bare wildcard", "*", /wildcard/],
    ["null", "null", /null/],
    ["a path", "https://app.example.com/app", /path/],
    ["a trailing slash", "https://app.example.com/", /path/],
    ["a query", "https://app.example.com?x=1", /query/],
    ["an empty query", "https://app.example.com?", /query/],
    ["a fragment", "https://app.example.com#top", /fragment/],
    ["userinfo", "https://user:pw@app.example.com", /userinfo/],
    ["a user name", "https://user@app.example.com", /userinfo/],
    ["http on a live product", "http://app.example.com", /https/],
    ["http on loopback for a live product", "http://localhost:3000", /https/],
    ["another scheme", "ftp://files.example.com", /https/],
    ["no scheme", "app.example.com", /origin such as/],
    ["an empty string", "", /origin such as/],
    ["no host", "https://", /host/],
    ["percent-encoding", "https://%65xample.com", /percent/],
    ["surrounding spaces", " https://app.example.com", /spaces/],
    ["a tab inside", "https://app.\texample.com", /spaces/],
    ["a backslash path", "https://app.example.com\\evil", /path/],
    ["an invalid host", "https://exa mple", /spaces/],
    ["an invalid port", "https://app.example.com:99999", /valid origin/],
    ["an empty host label", "https://a..com", /empty label/],
    ["a leading dot", "https://.a.com", /empty label/],
    ["a host label over 63 characters", `https://${"a".repeat(64)}.example.com`, /longer than 63/],
    ["a host over 253 characters", `https://${`${"a".repeat(63)}.`.repeat(4)}com`, /253/],
    ["a host label starting with a hyphen", "https://-a.com", /hyphen/],
    ["a host label ending with a hyphen", "https://a-.example.com", /hyphen/],
    ["a dollar sign in the host", "https://a$b.com", /letters, digits, hyphens and underscores/],
    ["a trailing dot", "https://a.com.", /end its host with a dot/],
    ["a trailing dot on localhost", "https://localhost.", /end its host with a dot/],
  ];

  test.each(refusals)("%s is refused with 422 and nothing changes", async (_, origin, message) => {
    await patch({ enabled: true, allowed_origins: ["https://kept.example"] });
    const before = await settings();
    const response = await patch({ allowed_origins: [origin] });
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("VALIDATION_FAILED");
    expect(response.body.error.details.errors["allowed_origins.0"][0]).toMatch(message);
    expect(await settings()).toEqual(before);
  });

  test("every invalid entry is listed at once, keyed by its index", async () => {
    const response = await patch({
      allowed_origins: ["https://ok.example", "*", "https://ok.example/path", "https://fine.example"],
    });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors).sort()).toEqual([
      "allowed_origins.1",
      "allowed_origins.2",
    ]);
  });

  test("21 origins are refused", async () => {
    const origins = Array.from({ length: 21 }, (_, i) => `https://app${i}.example.com`);
    const response = await patch({ enabled: true, allowed_origins: origins });
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("VALIDATION_FAILED");
    expect(Object.keys(response.body.error.details.errors)).toContain("allowed_origins");
    expect(await settings()).toMatchObject({ enabled: false, allowed_origins: [] });
  });

  test("the same origin twice, even spelled differently, is refused", async () => {
    const response = await patch({ allowed_origins: ["https://a.example", "HTTPS://A.EXAMPLE:443"] });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors["allowed_origins.1"]).toEqual(["repeats allowed_origins.0"]);
  });

  test("clearing the list while enabled fails and keeps the list", async () => {
    await patch({ enabled: true, allowed_origins: ["https://a.example"] });
    const response = await patch({ allowed_origins: [] });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.allowed_origins).toBeDefined();
    expect(await settings()).toMatchObject({ enabled: true, allowed_origins: ["https://a.example"] });
  });

  test("enabling without any origin fails", async () => {
    const response = await patch({ enabled: true });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.allowed_origins).toBeDefined();
    expect((await settings()).enabled).toBe(false);
  });

  test("a test product refuses http origins that are not loopback", async () => {
    const testProduct = await product("test");
    for (const origin of ["http://app.example.com", "http://192.168.1.10", "http://localhost.example.com"]) {
      const response = await patch({ allowed_origins: [origin] }, { id: testProduct, key: t.keys.test });
      expect(response.status).toBe(422);
      expect(response.body.error.details.errors["allowed_origins.0"][0]).toMatch(/loopback/);
    }
  });

  test.each([
    ["an unknown field", { enabled: true, origins: [] }],
    ["a non-boolean enabled", { enabled: "yes" }],
    ["a non-array list", { allowed_origins: "https://a.example" }],
    ["a non-string entry", { allowed_origins: [42] }],
    ["a null entry", { allowed_origins: [null] }],
  ])("%s is refused with 422", async (_, body) => {
    const response = await patch(body);
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("VALIDATION_FAILED");
    expect(await productVersion()).toBe(1);
  });
});

describe("errors and security", () => {
  test("a stale If-Match returns 409 and changes nothing, even for an origin-only change", async () => {
    await patch({ enabled: true, allowed_origins: ["https://a.example"] }, { ifMatch: "1" });
    const response = await patch({ allowed_origins: ["https://evil.example"] }, { ifMatch: '"1"' });
    expect(response.status).toBe(409);
    expect(response.body.error.code).toBe("VERSION_CONFLICT");
    expect(await settings()).toMatchObject({ allowed_origins: ["https://a.example"], version: 2 });
    expect(updatedEvents()).toHaveLength(1);
  });

  test("a product PATCH and a browser-runtime PATCH share one version", async () => {
    await patch({ allowed_origins: ["https://a.example"] });
    const stale = await t.call("PATCH", `/mgmt/v1/products/${productId}`, {
      body: { name: "Renamed" },
      headers: { "if-match": "1" },
    });
    expect(stale.status).toBe(409);
    await t.call("PATCH", `/mgmt/v1/products/${productId}`, { body: { name: "Renamed" } });
    const response = await patch({ allowed_origins: ["https://b.example"] }, { ifMatch: "2" });
    expect(response.status).toBe(409);
    expect((await patch({ allowed_origins: ["https://b.example"] }, { ifMatch: "3" })).status).toBe(200);
  });

  test("a malformed If-Match is a 400", async () => {
    const response = await patch({ enabled: false }, { ifMatch: "yesterday" });
    expect(response.status).toBe(400);
  });

  test("an archived product answers 409 PRODUCT_ARCHIVED to reads and changes", async () => {
    await patch({ enabled: true, allowed_origins: ["https://a.example"] });
    expect((await t.call("DELETE", `/mgmt/v1/products/${productId}`)).status).toBe(204);
    const read = await t.call("GET", path());
    expect(read.status).toBe(409);
    expect(read.body.error.code).toBe("PRODUCT_ARCHIVED");
    const change = await patch({ enabled: false });
    expect(change.status).toBe(409);
    expect(change.body.error.code).toBe("PRODUCT_ARCHIVED");
    const row = t.deps.sqlite.query("SELECT enabled FROM browser_runtime_settings").get() as {
      enabled: number;
    };
    expect(row.enabled).toBe(1);
  });

  test("an unknown product is 404, and another environment's product does not exist for this key", async () => {
    expect((await t.call("GET", path("prod_00000000000000000000000000"))).status).toBe(404);
    expect((await t.call("GET", path(), { key: t.keys.test })).status).toBe(404);
    expect((await patch({ enabled: false }, { key: t.keys.test })).status).toBe(404);
  });

  test("a workspace plan without browser_runtime cannot enable it (403), but can edit and disable", async () => {
    await patch({ enabled: true, allowed_origins: ["https://a.example"] });
    t.workspace.setPlan("personal");
    const edit = await patch({ allowed_origins: ["https://b.example"] });
    expect(edit.status).toBe(200);
    expect((await patch({ enabled: false })).status).toBe(200);
    const enable = await patch({ enabled: true });
    expect(enable.status).toBe(403);
    expect(enable.body.error.code).toBe("PLAN_ENTITLEMENT_REQUIRED");
    expect(enable.body.error.details).toEqual({ entitlement: "browser_runtime" });
    expect((await settings()).enabled).toBe(false);
  });

  test("reading needs products:read and changing needs products:write", async () => {
    const reader = t.keyFor("live", ["products:read"]);
    expect((await t.call("GET", path(), { key: reader })).status).toBe(200);
    const denied = await patch({ enabled: false }, { key: reader });
    expect(denied.status).toBe(403);
    expect(denied.body.error.code).toBe("INSUFFICIENT_SCOPE");
  });
});
