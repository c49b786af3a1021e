import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { type Sucrose, sucrose } from "elysia/sucrose";
import { sha256Hex } from "../../src/crypto/encoding.ts";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { MAX_BODY_PIECES } from "../../src/http/body.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const productBody = (code = "app") => ({ name: "App", code, environment: "live" });
const countProducts = () =>
  (t.deps.sqlite.query("SELECT count(*) AS n FROM products").get() as { n: number }).n;

describe("the error envelope", () => {
  test("malformed JSON answers 400 INVALID_REQUEST with all six fields", async () => {
    const response = await t.call("POST", "/mgmt/v1/products", {
      rawBody: '{"name": "App",',
      headers: { "content-type": "application/json", ...t.idem() },
    });
    expect(response.status).toBe(400);
    expect(response.body.error).toMatchObject({
      code: "INVALID_REQUEST",
      retryable: false,
      details: expect.any(Object),
    });
    expect(response.body.error.doc_url).toBe(`${BASE_URL}/docs/errors#INVALID_REQUEST`);
    expect(response.body.error.request_id).toBe(response.headers.get("x-request-id"));
    expect(typeof response.body.error.message).toBe("string");
  });

  test("a body that is not application/json answers 400", async () => {
    const response = await t.call("POST", "/mgmt/v1/products", {
      rawBody: JSON.stringify(productBody()),
      headers: { "content-type": "text/plain", ...t.idem() },
    });
    expect(response.status).toBe(400);
    expect(response.body.error.code).toBe("INVALID_REQUEST");
    expect(countProducts()).toBe(0);
  });

  test("a create without a body answers 400, not 422", async () => {
    const response = await t.call("POST", "/mgmt/v1/products", { headers: t.idem() });
    expect(response.status).toBe(400);
    expect(response.body.error.code).toBe("INVALID_REQUEST");
  });

  test("a JSON array where an object belongs answers 422", async () => {
    const response = await t.call("POST", "/mgmt/v1/products", { body: [productBody()], headers: t.idem() });
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("VALIDATION_FAILED");
  });

  test("a body over 64 KiB answers 413 and creates nothing", async () => {
    const response = await t.call("POST", "/mgmt/v1/products", {
      body: { ...productBody(), description: "x".repeat(70_000) },
      headers: t.idem(),
    });
    expect(response.status).toBe(413);
    expect(response.body.error.code).toBe("PAYLOAD_TOO_LARGE");
    expect(response.body.error.details.limit_bytes).toBe(65_536);
    expect(countProducts()).toBe(0);
  });

  test("an oversized body without Content-Length (chunked) is refused the same way", async () => {
    const chunk = new TextEncoder().encode(`{"name":"${"x".repeat(40_000)}`);
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue(chunk);
        controller.enqueue(chunk);
        controller.close();
      },
    });
    const response = await t.app.handle(
      new Request(`${BASE_URL}/mgmt/v1/products`, {
        method: "POST",
        body: stream,
        headers: { authorization: `Bearer ${t.keys.live}`, "content-type": "application/json", ...t.idem() },
      }),
    );
    expect(response.status).toBe(413);
  });

  test("a body without Content-Length in more pieces than the limit answers 400; one in a few pieces is read", async () => {
    const send = (pieces: string[]) =>
      t.app.handle(
        new Request(`${BASE_URL}/mgmt/v1/products`, {
          method: "POST",
          body: new ReadableStream({
            start(controller) {
              for (const piece of pieces) controller.enqueue(new TextEncoder().encode(piece));
              controller.close();
            },
          }),
          headers: {
            authorization: `Bearer ${t.keys.live}`,
            "content-type": "application/json",
            ...t.idem(),
          },
        }),
      );
    const text = JSON.stringify(productBody());
    const dribbled = await send([...text.padEnd(MAX_BODY_PIECES + 1, " ")]);
    expect(dribbled.status).toBe(400);
    expect((await dribbled.json()).error).toMatchObject({
      code: "INVALID_REQUEST",
      details: { max_pieces: MAX_BODY_PIECES },
    });
    expect(countProducts()).toBe(0);
    const thirds = Math.ceil(text.length / 3);
    const sent = await send([text.slice(0, thirds), text.slice(thirds, 2 * thirds), text.slice(2 * thirds)]);
    expect(sent.status).toBe(201);
  });

  test("a body nested absurdly deep answers 400 instead of exhausting the stack", async () => {
    const product = await t.call("POST", "/mgmt/v1/products", { body: productBody(), headers: t.idem() });
    const deep = `${"[".repeat(30_000)}${"]".repeat(30_000)}`;
    const response = await t.call("POST", "/mgmt/v1/policies", {
      rawBody: `{"product_id":"${product.body.data.public_id}","name":"x","entitlements":{"a":${deep}}}`,
      headers: { "content-type": "application/json", ...t.idem() },
    });
    expect(response.status).toBe(400);
    expect(response.body.error.details.max_depth).toBe(32);
    const reasonable = await t.call("POST", "/mgmt/v1/policies", {
      body: {
        product_id: product.body.data.public_id,
        name: "x",
        entitlements: { limits: { seats: { max: 5 } } },
      },
      headers: t.idem(),
    });
    expect(reasonable.status).toBe(201);
  });

  test("a number too large for a double (1e400) answers 422 naming its path", async () => {
    const product = await t.call("POST", "/mgmt/v1/products", { body: productBody(), headers: t.idem() });
    const response = await t.call("POST", "/mgmt/v1/policies", {
      rawBody: `{"product_id":"${product.body.data.public_id}","name":"x","entitlements":{"seats":1e400}}`,
      headers: { "content-type": "application/json", ...t.idem() },
    });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors["entitlements.seats"]).toBeDefined();
  });

  test("a nullable field given a wrong value is told what is wrong with the value, not which types the field takes", async () => {
    const create = (body: Record<string, unknown>) =>
      t.call("POST", "/mgmt/v1/customers", { body: { name: "Ada", ...body }, headers: t.idem() });
    const messages = async (body: Record<string, unknown>) =>
      (await create(body)).body.error.details.errors as Record<string, string[]>;
    expect(await messages({ email: "not an address" })).toEqual({
      email: ["is not in the expected form (or null)"],
    });
    expect(await messages({ email: 5 })).toEqual({ email: ["Expected string (or null)"] });
    expect(await messages({ external_ref: "x".repeat(201) })).toEqual({
      external_ref: ["Expected string length less or equal to 200 (or null)"],
    });
    expect((await create({ email: null, external_ref: null })).status).toBe(201);
  });

  test("a missing member or header is named once, as required, not in the validator's words", async () => {
    const noProduct = await t.call("POST", "/mgmt/v1/policies", { body: { name: "x" }, headers: t.idem() });
    expect(noProduct.status).toBe(422);
    expect(noProduct.body.error.details.errors).toEqual({ product_id: ["is required"] });
    // A member with a rule of its own is still "required" when it is absent, not told the rule.
    const noName = await t.call("POST", "/mgmt/v1/products", { body: { code: "desk" }, headers: t.idem() });
    expect(noName.body.error.details.errors).toEqual({ name: ["is required"] });
    const noKey = await t.call("POST", "/mgmt/v1/products", { body: productBody() });
    expect(noKey.status).toBe(400);
    expect(noKey.body.error.details.errors).toEqual({ "idempotency-key": ["is required"] });
  });

  test("a member named twice in one object answers 400 and creates nothing, however it is spelt or nested", async () => {
    for (const raw of [
      '{"name":"A","code":"dup-a","environment":"live","code":"dup-b"}',
      '{"name":"A","code":"dup-c","environment":"live","extra":{"k":1,"k":2}}',
      // The same name spelt with an escape is the same name once parsed.
      '{"name":"A","code":"dup-d","environment":"live","n\\u0061me":"B"}',
    ]) {
      const response = await t.call("POST", "/mgmt/v1/products", {
        rawBody: raw,
        headers: { "content-type": "application/json", ...t.idem() },
      });
      expect([response.status, response.body.error.code]).toEqual([400, "INVALID_REQUEST"]);
    }
    expect(countProducts()).toBe(0);
  });

  test("a lone surrogate or a NUL in a string or a key answers 422 naming where", async () => {
    for (const raw of [
      '{"name":"\\ud800","code":"x","environment":"live"}',
      '{"name":"A","code":"x","environment":"live","\\udc00":1}',
      '{"name":"a\\u0000b","code":"x","environment":"live"}',
      '{"name":"A","code":"x","environment":"live","k\\u0000":1}',
    ]) {
      const response = await t.call("POST", "/mgmt/v1/products", {
        rawBody: raw,
        headers: { "content-type": "application/json", ...t.idem() },
      });
      expect(response.status).toBe(422);
      expect(response.body.error.details.errors).toBeDefined();
    }
    expect(countProducts()).toBe(0);
  });

  test("an unknown route answers 404 with the envelope", async () => {
    const response = await t.call("GET", "/mgmt/v1/nothing-here");
    expect(response.status).toBe(404);
    expect(response.body.error.code).toBe("NOT_FOUND");
    const outside = await t.call("GET", "/no/such/path", { key: null });
    expect(outside.status).toBe(404);
    expect(outside.body.error.code).toBe("NOT_FOUND");
  });

  test("an unknown management route without a key answers 401, revealing nothing about routes", async () => {
    const response = await t.call("GET", "/mgmt/v1/nothing-here", { key: null });
    expect(response.status).toBe(401);
  });

  test("a failure inside the service answers 500 INTERNAL_ERROR without leaking internals", async () => {
    t.deps.sqlite.close();
    const response = await t.call("GET", "/mgmt/v1/products");
    expect(response.status).toBe(500);
    expect(response.body.error.code).toBe("INTERNAL_ERROR");
    expect(response.body.error.retryable).toBe(true);
    expect(response.body.error.request_id).toBe(response.headers.get("x-request-id"));
    expect(response.text).not.toContain("at ");
    expect(response.text.toLowerCase()).not.toContain("sqlite");
  });

  test("every response carries a fresh request id", async () => {
    const a = await t.call("GET", "/healthz", { key: null });
    const b = await t.call("GET", "/healthz", { key: null });
    expect(a.headers.get("x-request-id")).toMatch(/^req_[0-9A-Z]{26}$/);
    expect(a.headers.get("x-request-id")).not.toBe(b.headers.get("x-request-id"));
  });
});

describe("the Authorization header", () => {
  test("the Bearer scheme is matched in any case (RFC 9110 §11.1) and may be followed by several spaces", async () => {
    for (const authorization of [
      `bearer ${t.keys.live}`,
      `BEARER ${t.keys.live}`,
      `bEaReR ${t.keys.live}`,
      `Bearer   ${t.keys.live}`,
    ]) {
      const response = await t.call("GET", "/mgmt/v1/products", { key: null, headers: { authorization } });
      expect({ authorization, status: response.status }).toEqual({ authorization, status: 200 });
    }
  });

  test("another scheme, no space, a tab or anything after the key is still 401", async () => {
    const key = t.keys.live;
    for (const authorization of [
      `Basic ${key}`,
      `Bearer${key}`,
      `Bearer\t${key}`,
      `Bearer ${key} x`,
      "Bearer ",
    ]) {
      const response = await t.call("GET", "/mgmt/v1/products", { key: null, headers: { authorization } });
      expect({ authorization, status: response.status }).toEqual({ authorization, status: 401 });
      expect(response.headers.get("www-authenticate")).toBe('Bearer realm="mgmt"');
    }
  });
});

describe("what a refused Authorization header says", () => {
  const HINT = "Send an API key as 'Authorization: Bearer <key>'.";
  const refusal = async (authorization: string | null) => {
    const response = await t.call("GET", "/mgmt/v1/products", {
      key: null,
      headers: authorization === null ? {} : { authorization },
    });
    return {
      authorization,
      status: response.status,
      code: response.body?.error?.code,
      message: response.body?.error?.message,
    };
  };

  test("a good key sent without the Bearer scheme, or under another one, is told how to send it", async () => {
    const key = t.keys.live;
    for (const authorization of [
      key,
      `Basic ${key}`,
      `Basic ${Buffer.from(`${key}:`).toString("base64")}`,
      `Token ${key}`,
      `Bearer${key}`,
      `Bearer\t${key}`,
      `Bearer ${key} x`,
      "Bearer ",
      null,
    ]) {
      expect(await refusal(authorization)).toEqual({
        authorization,
        status: 401,
        code: "UNAUTHENTICATED",
        message: HINT,
      });
    }
  });

  test("a Bearer token that is no live key is said to be not valid", async () => {
    const revoked = t.apiKeys.create({ environment: "live", scopes: ["products:read"], name: "revoked" });
    t.apiKeys.revoke(revoked.id);
    for (const authorization of [
      `Bearer lsk_live_${"x".repeat(32)}`,
      `bearer ${revoked.apiKey}`,
      "Bearer not-a-key",
    ]) {
      expect(await refusal(authorization)).toEqual({
        authorization,
        status: 401,
        code: "UNAUTHENTICATED",
        message: "The API key is not valid.",
      });
    }
  });
});

describe("query parameters", () => {
  test("a query parameter sent twice answers 400 on every route, not only lists, naming it with every value", async () => {
    const usage = await t.call("GET", "/mgmt/v1/reports/usage?period=previous_month&period=current_month");
    expect(usage.status).toBe(400);
    expect(usage.body.error).toMatchObject({
      code: "INVALID_REQUEST",
      message: "period was sent more than once.",
      details: { period: ["previous_month", "current_month"] },
    });
    // The same answer a list gives.
    const list = await t.call("GET", "/mgmt/v1/products?status=active&status=archived");
    expect([list.status, list.body.error.message, list.body.error.details]).toEqual([
      400,
      "status was sent more than once.",
      { status: ["active", "archived"] },
    ]);
    // A parameter the route does not read, on a management, a runtime and a public route.
    for (const [method, path] of [
      ["GET", "/mgmt/v1/plan?x=1&x=1"],
      ["POST", "/runtime/v1/time?x=1&x=2"],
      ["GET", "/healthz?x&x"],
    ] as const) {
      const response = await t.call(method, path, {
        key: path.startsWith("/mgmt/") ? undefined : null,
        body:
          method === "POST" ? { product_id: "prod_x", nonce: "a-time-nonce-of-enough-length" } : undefined,
      });
      expect({ path, status: response.status, details: response.body.error?.details }).toEqual({
        path,
        status: 400,
        details: { x: expect.any(Array) },
      });
    }
    // Sent once, each still answers.
    expect((await t.call("GET", "/mgmt/v1/reports/usage?period=previous_month")).status).toBe(200);
    expect((await t.call("GET", "/healthz?x")).status).toBe(200);
  });

  test("a caller without a key or the route's scope hears 401 or 403 before a repeated parameter", async () => {
    const path = "/mgmt/v1/reports/usage?period=previous_month&period=current_month";
    expect((await t.call("GET", path, { key: null })).status).toBe(401);
    const productsOnly = t.keyFor("live", ["products:read"]);
    const refused = await t.call("GET", path, { key: productsOnly });
    expect([refused.status, refused.body.error.code]).toEqual([403, "INSUFFICIENT_SCOPE"]);
  });
});

describe("X-Content-Type-Options", () => {
  test("every answer carries nosniff once: JSON, errors, pages, assets, preflights, health", async () => {
    const answers = [
      await t.call("GET", "/mgmt/v1/products"),
      await t.call("GET", "/mgmt/v1/products", { key: null }),
      await t.call("POST", "/mgmt/v1/products", {
        rawBody: "{not json",
        headers: { "content-type": "application/json" },
      }),
      await t.call("GET", "/no/such/path", { key: null }),
      await t.call("POST", "/runtime/v1/time", {
        key: null,
        body: { product_id: "prod_x", nonce: "n".repeat(22) },
      }),
      await t.call("GET", "/runtime/v1/products/prod_00000000000000000000000000/trust-bundle", { key: null }),
      await t.call("OPTIONS", "/runtime/v1/time", {
        key: null,
        headers: { origin: "https://app.example.com", "access-control-request-method": "POST" },
      }),
      await t.call("GET", "/healthz", { key: null }),
      await t.call("GET", "/openapi.json", { key: null }),
      await t.call("GET", "/docs", { key: null }),
      await t.call("GET", "/docs/errors", { key: null }),
      await t.call("GET", "/docs/assets/swagger-ui.css", { key: null }),
      await t.call("GET", "/passkeys/v1/register", { key: null }),
      await t.call("GET", "/billing/v1/claims", { key: null }),
    ];
    for (const answer of answers)
      expect({ status: answer.status, nosniff: answer.headers.get("x-content-type-options") }).toEqual({
        status: answer.status,
        nosniff: "nosniff",
      });
  });
});

describe("what every request pays for", () => {
  // Elysia reads the hooks' source to decide what every request's handler prepares; a hook that
  // seemed to hand its context to a function made it parse the cookies and the query and copy the
  // headers of every request (src/http/request-path.ts). `inference` is protected in its type.
  const NOTHING_UNASKED = { cookie: false, query: false, headers: false, server: false, url: false };
  const inferenceOf = (app: unknown) => (app as { inference: Record<string, boolean> }).inference;

  test("the shared hooks ask Elysia for no cookies, query or header object, so no route prepares them unasked", () => {
    expect(inferenceOf(t.app)).toMatchObject(NOTHING_UNASKED);
  });

  test("every shared hook takes its context by destructuring it, which no minifier can turn into 'passed on'", () => {
    const { event } = t.app as unknown as { event: Record<string, { fn: () => unknown }[] | undefined> };
    const hooks = Object.values(event).flatMap((list) => (Array.isArray(list) ? list : []));
    expect(hooks.length).toBeGreaterThanOrEqual(8);
    for (const hook of hooks) expect(String(hook.fn)).toMatch(/^(async\s*)?\(\{/);
  });

  test("so do they once minified, as the executable is built", async () => {
    // The executable is minified (build/compile.ts): there a context named `s` read as passed on
    // in `(s)=>{...f(i.headers,a)...}`, though the source destructured it.
    const outdir = join(t.dir, "minified");
    const built = await Bun.build({
      entrypoints: [join(import.meta.dir, "../../src/app.ts")],
      target: "bun",
      format: "esm",
      minify: true,
      outdir,
    });
    // Bun.build throws on a failed build; its one output is the bundle.
    const bundle = built.outputs[0]?.path ?? "";
    const { createApp: createMinifiedApp } = (await import(bundle)) as typeof import("../../src/app.ts");
    const app = createMinifiedApp(t.deps, {
      baseUrl: BASE_URL,
      managementRateLimit: { name: "mgmt", limit: 1000, windowSec: 1 },
      runtimeRateLimits: { ip: null, activation: null, license: null },
    });
    expect(inferenceOf(app)).toMatchObject(NOTHING_UNASKED);
    // Nor does any route's own handler or hooks (the shared ones included): none reads cookies.
    const askingForCookies = app.routes
      .filter((route) => sucrose({ handler: route.handler, ...route.hooks } as Sucrose.LifeCycle).cookie)
      .map((route) => `${route.method} ${route.path}`);
    expect(app.routes.length).toBeGreaterThan(50);
    expect(askingForCookies).toEqual([]);
  });
});

describe("rate limits on management routes", () => {
  test("every response carries RateLimit headers and the request past the limit answers 429 with Retry-After", async () => {
    t.close();
    t = createTestContext({ managementRateLimit: { limit: 3, windowSec: 60 } });
    for (let i = 0; i < 3; i++) {
      const ok = await t.call("GET", "/mgmt/v1/products");
      expect(ok.status).toBe(200);
      expect(ok.headers.get("ratelimit-policy")).toBe('"mgmt";q=3;w=60');
      expect(ok.headers.get("ratelimit")).toMatch(new RegExp(`^"mgmt";r=${2 - i};t=\\d+$`));
    }
    const refused = await t.call("GET", "/mgmt/v1/products");
    expect(refused.status).toBe(429);
    expect(refused.body.error.code).toBe("RATE_LIMITED");
    expect(refused.body.error.retryable).toBe(true);
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    const otherKey = await t.call("GET", "/mgmt/v1/products", { key: t.keys.test });
    expect(otherKey.status).toBe(200);
    t.clock.advance(20);
    expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
  });
});

describe("Idempotency-Key", () => {
  const key = { "idempotency-key": "create-app-product-0001" };

  test("the same key and body replays the first response and creates nothing more", async () => {
    const first = await t.call("POST", "/mgmt/v1/products", { body: productBody(), headers: key });
    const second = await t.call("POST", "/mgmt/v1/products", { body: productBody(), headers: key });
    expect(first.status).toBe(201);
    expect(second.status).toBe(201);
    expect(second.headers.get("idempotent-replayed")).toBe("true");
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    expect(second.body).toEqual(first.body);
    expect(second.headers.get("etag")).toBe(first.headers.get("etag"));
    expect(countProducts()).toBe(1);
  });

  test("the same key with a different body answers 409 IDEMPOTENCY_CONFLICT, not retryable", async () => {
    await t.call("POST", "/mgmt/v1/products", { body: productBody(), headers: key });
    const response = await t.call("POST", "/mgmt/v1/products", { body: productBody("other"), headers: key });
    expect(response.status).toBe(409);
    expect(response.body.error).toMatchObject({ code: "IDEMPOTENCY_CONFLICT", retryable: false });
    expect(countProducts()).toBe(1);
  });

  test("the body fingerprint ignores key order and whitespace (canonical JSON)", async () => {
    await t.call("POST", "/mgmt/v1/products", { body: productBody(), headers: key });
    const reordered = await t.call("POST", "/mgmt/v1/products", {
      rawBody: ' { "environment" : "live", "code": "app", "name": "App" } ',
      headers: { "content-type": "application/json", ...key },
    });
    expect(reordered.status).toBe(201);
    expect(reordered.headers.get("idempotent-replayed")).toBe("true");
  });

  test("a key left in flight by an older version answers 409 with retryable true", async () => {
    // What a version that claimed keys before the work left behind when it died mid-request.
    const scope = t.apiKeys.authenticate(t.keys.live)?.id ?? "";
    const fingerprint = sha256Hex(canonicalize(productBody()));
    t.deps.sqlite.run(
      `INSERT INTO idempotency_records (scope, method, route, idempotency_key, fingerprint, state, created_at, expires_at)
       VALUES (?, 'POST', '/mgmt/v1/products', ?, ?, 'in_flight', ?, ?)`,
      [scope, key["idempotency-key"], fingerprint, Date.now(), Date.now() + 60_000],
    );
    const response = await t.call("POST", "/mgmt/v1/products", { body: productBody(), headers: key });
    expect(response.status).toBe(409);
    expect(response.body.error).toMatchObject({ code: "IDEMPOTENCY_CONFLICT", retryable: true });
    expect(countProducts()).toBe(0);
  });

  test("concurrent requests with one key make exactly one product, and the others replay it", async () => {
    const responses = await Promise.all(
      Array.from({ length: 10 }, () =>
        t.call("POST", "/mgmt/v1/products", { body: productBody(), headers: key }),
      ),
    );
    expect(countProducts()).toBe(1);
    expect(responses.map((r) => r.status)).toEqual(Array(10).fill(201));
    expect(new Set(responses.map((r) => r.body.data.public_id)).size).toBe(1);
    expect(responses.filter((r) => r.headers.get("idempotent-replayed") === "true")).toHaveLength(9);
  });

  test("a missing or malformed key answers 400", async () => {
    const missing = await t.call("POST", "/mgmt/v1/products", { body: productBody() });
    expect(missing.status).toBe(400);
    const short = await t.call("POST", "/mgmt/v1/products", {
      body: productBody(),
      headers: { "idempotency-key": "short" },
    });
    expect(short.status).toBe(400);
    const long = await t.call("POST", "/mgmt/v1/products", {
      body: productBody(),
      headers: { "idempotency-key": "k".repeat(256) },
    });
    expect(long.status).toBe(400);
    expect(countProducts()).toBe(0);
  });

  test("keys are scoped per API key: another key may reuse the same value", async () => {
    const liveKey2 = t.keyFor("live");
    await t.call("POST", "/mgmt/v1/products", { body: productBody("one"), headers: key });
    const other = await t.call("POST", "/mgmt/v1/products", {
      key: liveKey2,
      body: productBody("two"),
      headers: key,
    });
    expect(other.status).toBe(201);
    expect(countProducts()).toBe(2);
  });

  test("a failed attempt releases the key, so the corrected retry runs", async () => {
    await t.call("POST", "/mgmt/v1/products", { body: productBody("taken"), headers: t.idem() });
    const clash = await t.call("POST", "/mgmt/v1/products", { body: productBody("taken"), headers: key });
    expect(clash.status).toBe(422);
    const fixed = await t.call("POST", "/mgmt/v1/products", { body: productBody("free"), headers: key });
    expect(fixed.status).toBe(201);
    expect(fixed.headers.get("idempotent-replayed")).toBeNull();
  });

  test("a key is kept for 24 hours, then used afresh and stored again", async () => {
    const first = await t.call("POST", "/mgmt/v1/products", { body: productBody("first"), headers: key });
    t.clock.advance(24 * 3600 - 1);
    const replay = await t.call("POST", "/mgmt/v1/products", { body: productBody("first"), headers: key });
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.body.data.public_id).toBe(first.body.data.public_id);
    t.clock.advance(2);
    const later = await t.call("POST", "/mgmt/v1/products", { body: productBody("second"), headers: key });
    expect(later.status).toBe(201);
    expect(later.headers.get("idempotent-replayed")).toBeNull();
    // The expired record was replaced by the new one, which replays from now on.
    const again = await t.call("POST", "/mgmt/v1/products", { body: productBody("second"), headers: key });
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.body.data.public_id).toBe(later.body.data.public_id);
    expect(countProducts()).toBe(2);
  });
});
