import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { PLANS } from "../../src/domain/plans.ts";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { BrowserOriginCache } from "../../src/modules/products/browser-runtime-service.ts";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import {
  activatedDevice,
  heartbeatPath,
  nowSec,
  proofCall,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";

/** CORS on the Runtime API, through real preflight and actual requests (src/http/cors.ts). */
const APP = "https://app.example.com";
const OTHER = "https://other.example.com";
const STRANGER = "https://stranger.example.com";

let t: TestContext;
let a: RuntimeFixture;
let b: RuntimeFixture;

const enable = (productId: string, origins: string[], enabled = true, key?: string) =>
  t.call("PATCH", `/mgmt/v1/products/${productId}/browser-runtime`, {
    key,
    body: { enabled, allowed_origins: origins },
  });

beforeEach(async () => {
  t = createTestContext();
  a = await runtimeFixture(t, { policy: { max_machines: 10 } });
  b = await runtimeFixture(t);
  expect((await enable(a.productId, [APP])).status).toBe(200);
  expect((await enable(b.productId, [OTHER])).status).toBe(200);
});
afterEach(() => t.close());

const preflight = (
  path: string,
  origin: string | null,
  method = "POST",
  headers: Record<string, string> = {},
) =>
  t.call("OPTIONS", path, {
    key: null,
    headers: {
      ...(origin === null ? {} : { origin }),
      "access-control-request-method": method,
      "access-control-request-headers": "content-type,idempotency-key",
      ...headers,
    },
  });

function activation(fixture: RuntimeFixture, origin: string | null, device = new TestDevice()) {
  const body = device.activationBody({
    licenseKey: fixture.licenseKey,
    productId: fixture.productId,
    clientTime: nowSec(t),
  });
  return t.call("POST", "/runtime/v1/activations", {
    key: null,
    body,
    headers: {
      "idempotency-key": `cors-activation-${Math.random().toString(36).slice(2)}`,
      ...(origin === null ? {} : { origin }),
    },
  });
}

const trustBundle = (productId: string) => `/runtime/v1/products/${productId}/trust-bundle`;

describe("preflight", () => {
  test("a preflight from an allowed origin is answered 204 with every header the browser needs", async () => {
    const response = await preflight("/runtime/v1/activations", APP);
    expect(response.status).toBe(204);
    expect(response.text).toBe("");
    expect(response.headers.get("access-control-allow-origin")).toBe(APP);
    expect(response.headers.get("access-control-allow-methods")).toBe("GET, POST, DELETE");
    const allowHeaders = response.headers.get("access-control-allow-headers")?.toLowerCase().split(", ");
    expect(allowHeaders).toEqual(
      expect.arrayContaining([
        "content-type",
        "idempotency-key",
        "x-service-activation",
        "x-service-timestamp",
        "x-service-nonce",
        "x-service-signature",
      ]),
    );
    expect(response.headers.get("access-control-max-age")).toBe("600");
    expect(response.headers.get("vary")).toContain("Origin");
    expect(response.headers.get("access-control-allow-credentials")).toBeNull();
  });

  test("a preflight from an origin no product lists gets 204 without any CORS header", async () => {
    for (const origin of [
      STRANGER,
      "null",
      "https://APP.example.com",
      "http://app.example.com",
      `${APP}.evil.com`,
    ]) {
      const response = await preflight("/runtime/v1/activations", origin);
      expect(response.status).toBe(204);
      expect(response.headers.get("access-control-allow-origin")).toBeNull();
      expect(response.headers.get("access-control-allow-methods")).toBeNull();
      expect(response.headers.get("access-control-allow-headers")).toBeNull();
    }
  });

  test("a preflight without Origin gets no CORS header", async () => {
    const response = await preflight("/runtime/v1/time", null);
    expect(response.status).toBe(204);
    expect(response.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("disabling the runtime stops preflights at once; enabling again restores them", async () => {
    await enable(a.productId, [APP], false);
    expect(
      (await preflight("/runtime/v1/activations", APP)).headers.get("access-control-allow-origin"),
    ).toBeNull();
    await t.call("PATCH", `/mgmt/v1/products/${a.productId}/browser-runtime`, { body: { enabled: true } });
    expect((await preflight("/runtime/v1/activations", APP)).headers.get("access-control-allow-origin")).toBe(
      APP,
    );
  });

  test("removing an origin from the list stops it at once", async () => {
    await enable(a.productId, ["https://new.example.com"]);
    expect(
      (await preflight("/runtime/v1/activations", APP)).headers.get("access-control-allow-origin"),
    ).toBeNull();
    expect(
      (await preflight("/runtime/v1/activations", "https://new.example.com")).headers.get(
        "access-control-allow-origin",
      ),
    ).toBe("https://new.example.com");
  });

  test("a trust-bundle preflight is answered for the product in the path only", async () => {
    const own = await preflight(trustBundle(b.productId), OTHER, "GET");
    expect(own.headers.get("access-control-allow-origin")).toBe(OTHER);
    const foreign = await preflight(trustBundle(b.productId), APP, "GET");
    expect(foreign.status).toBe(204);
    expect(foreign.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("Private Network Access is granted to an allowed origin that asks for it", async () => {
    const asked = { "access-control-request-private-network": "true" };
    const allowed = await preflight("/runtime/v1/activations", APP, "POST", asked);
    expect(allowed.headers.get("access-control-allow-private-network")).toBe("true");
    const refused = await preflight("/runtime/v1/activations", STRANGER, "POST", asked);
    expect(refused.headers.get("access-control-allow-private-network")).toBeNull();
  });

  test("a preflight counts nothing: it never reaches quotas, limits or the body parser", async () => {
    const usage = async () => (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas;
    const before = await usage();
    for (let i = 0; i < 30; i++) {
      const response = await t.call("OPTIONS", "/runtime/v1/activations", {
        key: null,
        rawBody: "x".repeat(20 * 1024),
        headers: { origin: APP, "access-control-request-method": "POST", "content-type": "text/plain" },
      });
      // 20 KiB of text/plain would be a 413 or a 400 had the body been read.
      expect(response.status).toBe(204);
      expect(response.headers.get("x-request-id")).toMatch(/^req_[0-9A-Z]{26}$/);
      expect(response.headers.get("ratelimit")).toBeNull();
    }
    expect(await usage()).toEqual(before);
  });
});

describe("actual requests", () => {
  test("an activation from an allowed origin carries Access-Control-Allow-Origin and the exposed headers", async () => {
    const response = await activation(a, APP);
    expect(response.status).toBe(201);
    expect(response.headers.get("access-control-allow-origin")).toBe(APP);
    const exposed = response.headers.get("access-control-expose-headers")?.toLowerCase().split(", ");
    expect(exposed).toEqual(
      expect.arrayContaining([
        "x-request-id",
        "ratelimit",
        "ratelimit-policy",
        "retry-after",
        "idempotent-replayed",
        "x-service-test-clock",
      ]),
    );
    expect(response.headers.get("vary")).toContain("Origin");
  });

  test("an activation naming a product that does not list the origin gets no Access-Control-Allow-Origin", async () => {
    // OTHER is listed by product b, so its preflight passes; the answer about product a stays unreadable.
    const response = await activation(a, OTHER);
    expect(response.headers.get("access-control-allow-origin")).toBeNull();
    expect(response.headers.get("access-control-expose-headers")).toBeNull();
  });

  test("a request without Origin gets no CORS header, only Vary", async () => {
    const response = await activation(a, null);
    expect(response.status).toBe(201);
    expect(response.headers.get("access-control-allow-origin")).toBeNull();
    expect(response.headers.get("vary")).toBe("Origin");
  });

  test("device-proof calls follow the product of the activation", async () => {
    const { device, activationId } = await activatedDevice(t, a);
    const beat = (origin: string) =>
      proofCall(
        t,
        device,
        "POST",
        heartbeatPath(activationId),
        activationId,
        { machine_info_digest: machineInfoDigest({ os: "linux", arch: "x64" }) },
        { headers: { origin } },
      );
    const allowed = await beat(APP);
    expect(allowed.status).toBe(200);
    expect(allowed.headers.get("access-control-allow-origin")).toBe(APP);
    const foreign = await beat(OTHER);
    expect(foreign.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("the trust bundle is readable only from its product's origins", async () => {
    const own = await t.call("GET", trustBundle(a.productId), { key: null, headers: { origin: APP } });
    expect(own.status).toBe(200);
    expect(own.headers.get("access-control-allow-origin")).toBe(APP);
    const foreign = await t.call("GET", trustBundle(a.productId), { key: null, headers: { origin: OTHER } });
    expect(foreign.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("error answers are readable by an allowed page: 400 for an unreadable body, 422 naming its product", async () => {
    const malformed = await t.call("POST", "/runtime/v1/time", {
      key: null,
      rawBody: "{not json",
      headers: { origin: APP, "content-type": "application/json" },
    });
    expect(malformed.status).toBe(400);
    expect(malformed.headers.get("access-control-allow-origin")).toBe(APP);
    const invalid = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: a.productId, nonce: "short" },
      headers: { origin: APP },
    });
    expect(invalid.status).toBe(422);
    expect(invalid.headers.get("access-control-allow-origin")).toBe(APP);
    const foreign = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: b.productId, nonce: "short" },
      headers: { origin: APP },
    });
    expect(foreign.status).toBe(422);
    expect(foreign.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("a disabled product's origins get no CORS on actual requests", async () => {
    await enable(a.productId, [APP], false);
    const response = await activation(a, APP);
    expect(response.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("a request naming an unknown product or activation gets no Access-Control-Allow-Origin", async () => {
    const unknownProduct = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: "prod_00000000000000000000000000", nonce: "n".repeat(22) },
      headers: { origin: APP },
    });
    expect(unknownProduct.status).toBe(404);
    expect(unknownProduct.headers.get("access-control-allow-origin")).toBeNull();
    const unknownActivation = await proofCall(
      t,
      new TestDevice(),
      "DELETE",
      "/runtime/v1/activations/act_00000000000000000000000000",
      "act_00000000000000000000000000",
      undefined,
      { headers: { origin: APP } },
    );
    expect(unknownActivation.status).toBeGreaterThanOrEqual(400);
    expect(unknownActivation.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("archiving a product leaves its runtime, and so its CORS, as they were", async () => {
    expect((await t.call("DELETE", `/mgmt/v1/products/${a.productId}`)).status).toBe(204);
    const response = await t.call("GET", trustBundle(a.productId), { key: null, headers: { origin: APP } });
    expect(response.status).toBe(200);
    expect(response.headers.get("access-control-allow-origin")).toBe(APP);
  });

  test("a test product serves its http loopback origins", async () => {
    const local = await runtimeFixture(t, { key: t.keys.test });
    await enable(local.productId, ["http://localhost:5173"], true, t.keys.test);
    const response = await activation(local, "http://localhost:5173");
    expect(response.status).toBe(201);
    expect(response.headers.get("access-control-allow-origin")).toBe("http://localhost:5173");
  });
});

describe("the activation header decides only the device-proof routes", () => {
  /** A page on APP (listed by a only) adds one of a's activations to a request naming b. */
  const withActivation = (activationId: string, origin = APP) => ({
    origin,
    "x-service-activation": activationId,
  });

  test("a request naming another product in its body is decided by that product, not by the header", async () => {
    const { activationId } = await activatedDevice(t, a);
    const device = new TestDevice();
    const activationOfB = await t.call("POST", "/runtime/v1/activations", {
      key: null,
      body: device.activationBody({
        licenseKey: b.licenseKey,
        productId: b.productId,
        clientTime: nowSec(t),
      }),
      headers: { "idempotency-key": "cors-header-activation-b", ...withActivation(activationId) },
    });
    expect(activationOfB.status).toBe(201);
    expect(activationOfB.headers.get("access-control-allow-origin")).toBeNull();
    const time = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: b.productId, nonce: "n".repeat(22) },
      headers: withActivation(activationId),
    });
    expect(time.status).toBe(200);
    expect(time.headers.get("access-control-allow-origin")).toBeNull();
    const start = await t.call("POST", "/runtime/v1/email-verifications", {
      key: null,
      body: { product_id: b.productId, email: "ada@example.com" },
      headers: withActivation(activationId),
    });
    expect(start.headers.get("access-control-allow-origin")).toBeNull();
    const trial = await t.call("POST", "/runtime/v1/trial-verifications", {
      key: null,
      body: { product_id: b.productId, email: "ada@example.com" },
      headers: withActivation(activationId),
    });
    expect(trial.headers.get("access-control-allow-origin")).toBeNull();
    // The same requests naming a stay readable, with or without the header.
    const own = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: a.productId, nonce: "n".repeat(22) },
      headers: withActivation(activationId),
    });
    expect(own.headers.get("access-control-allow-origin")).toBe(APP);
  });

  test("a loopback origin of a test product cannot read a live product's answer through a test activation", async () => {
    const LOCAL = "http://localhost:5173";
    const local = await runtimeFixture(t, { key: t.keys.test, policy: { max_machines: 10 } });
    await enable(local.productId, [LOCAL], true, t.keys.test);
    const { activationId } = await activatedDevice(t, local);
    const device = new TestDevice();
    const live = await t.call("POST", "/runtime/v1/activations", {
      key: null,
      body: device.activationBody({
        licenseKey: a.licenseKey,
        productId: a.productId,
        clientTime: nowSec(t),
      }),
      headers: { "idempotency-key": "cors-header-cross-env", ...withActivation(activationId, LOCAL) },
    });
    expect(live.status).toBe(201);
    expect(live.headers.get("access-control-allow-origin")).toBeNull();
    const time = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: a.productId, nonce: "n".repeat(22) },
      headers: withActivation(activationId, LOCAL),
    });
    expect(time.status).toBe(200);
    expect(time.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("the device-proof routes are decided by their activation, with or without a trailing slash", async () => {
    const { device, activationId } = await activatedDevice(t, a);
    for (const path of [heartbeatPath(activationId), `${heartbeatPath(activationId)}/`]) {
      const beat = await proofCall(
        t,
        device,
        "POST",
        path,
        activationId,
        { machine_info_digest: machineInfoDigest({ os: "linux", arch: "x64" }) },
        { headers: { origin: APP } },
      );
      expect(beat.headers.get("access-control-allow-origin")).toBe(APP);
    }
    const lease = await proofCall(
      t,
      device,
      "POST",
      "/runtime/v1/leases",
      activationId,
      { activation_id: activationId, instance_id: "instance-1" },
      {
        headers: { origin: APP },
      },
    );
    expect(lease.status).toBe(201);
    expect(lease.headers.get("access-control-allow-origin")).toBe(APP);
    const foreignLease = await proofCall(
      t,
      device,
      "POST",
      "/runtime/v1/leases",
      activationId,
      {},
      {
        headers: { origin: OTHER },
      },
    );
    expect(foreignLease.headers.get("access-control-allow-origin")).toBeNull();
    const deactivated = await proofCall(
      t,
      device,
      "DELETE",
      `/runtime/v1/activations/${activationId}`,
      activationId,
      undefined,
      { headers: { origin: APP } },
    );
    expect(deactivated.headers.get("access-control-allow-origin")).toBe(APP);
  });
});

describe("the trust bundle with a trailing slash", () => {
  test("is decided by the product in its path, preflight and GET", async () => {
    const silent = await runtimeFixture(t);
    for (const suffix of ["", "/"]) {
      const path = (productId: string) => `${trustBundle(productId)}${suffix}`;
      const own = await t.call("GET", path(a.productId), { key: null, headers: { origin: APP } });
      expect(own.status).toBe(200);
      expect(own.headers.get("access-control-allow-origin")).toBe(APP);
      expect(
        (await preflight(path(a.productId), APP, "GET")).headers.get("access-control-allow-origin"),
      ).toBe(APP);
      for (const productId of [b.productId, silent.productId]) {
        const foreign = await t.call("GET", path(productId), { key: null, headers: { origin: APP } });
        expect(foreign.status).toBe(200);
        expect(foreign.headers.get("access-control-allow-origin")).toBeNull();
        const pre = await preflight(path(productId), APP, "GET");
        expect(pre.status).toBe(204);
        expect(pre.headers.get("access-control-allow-origin")).toBeNull();
      }
    }
  });
});

describe("no CORS outside the Runtime API", () => {
  test("Management API answers carry no CORS header, whatever the origin", async () => {
    const read = await t.call("GET", `/mgmt/v1/products/${a.productId}/browser-runtime`, {
      headers: { origin: APP },
    });
    expect(read.status).toBe(200);
    expect(read.headers.get("access-control-allow-origin")).toBeNull();
    expect(read.headers.get("vary")).toBeNull();
    const write = await t.call("PATCH", `/mgmt/v1/products/${a.productId}/browser-runtime`, {
      body: { allowed_origins: [APP, OTHER] },
      headers: { origin: APP },
    });
    expect(write.status).toBe(200);
    expect(write.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("a Management API preflight is not answered and gets no CORS header", async () => {
    const response = await preflight(`/mgmt/v1/products/${a.productId}/browser-runtime`, APP, "PATCH");
    expect(response.status).not.toBe(204);
    expect(response.headers.get("access-control-allow-origin")).toBeNull();
    expect(response.headers.get("access-control-allow-methods")).toBeNull();
  });

  test("docs, the OpenAPI document and health carry no CORS header", async () => {
    for (const path of ["/docs", "/openapi.json", "/healthz"]) {
      const response = await t.call("GET", path, { key: null, headers: { origin: APP } });
      expect(response.headers.get("access-control-allow-origin")).toBeNull();
      const pre = await preflight(path, APP, "GET");
      expect(pre.headers.get("access-control-allow-origin")).toBeNull();
    }
  });
});

describe("the origin cache", () => {
  test("it needs no store read per request, and picks up another process's plan change within 5 s", () => {
    let plan = PLANS.self_hosted as (typeof PLANS)[string];
    let now = 0;
    let reads = 0;
    const cache = new BrowserOriginCache(
      t.deps.sqlite,
      () => {
        reads++;
        return plan;
      },
      () => now,
    );
    expect(cache.allows(a.productId, APP)).toBe(true);
    for (let i = 0; i < 100; i++) cache.allowedAnywhere(APP);
    expect(reads).toBe(1);
    plan = PLANS.personal as (typeof PLANS)[string];
    now = 4_999;
    expect(cache.allowedAnywhere(APP)).toBe(true);
    now = 5_000;
    expect(cache.allowedAnywhere(APP)).toBe(false);
    expect(cache.allows(a.productId, APP)).toBe(false);
    expect(reads).toBe(2);
  });

  test("a workspace plan without browser_runtime serves no CORS even for enabled products", async () => {
    t.workspace.setPlan("personal");
    // The in-process PATCH invalidates at once; the plan change alone would show within 5 s.
    await enable(a.productId, [APP, "https://extra.example.com"]);
    const response = await preflight("/runtime/v1/activations", APP);
    expect(response.headers.get("access-control-allow-origin")).toBeNull();
  });
});

describe("with the runtime rate limits", () => {
  test("preflights use none of a window, and a 429 is readable by an allowed page", async () => {
    const limited = createTestContext({ runtimeRateLimits: { ip: { limit: 3, windowSec: 60 } } });
    try {
      const product = await limited.call("POST", "/mgmt/v1/products", {
        body: { name: "Web", code: "web", environment: "live" },
        headers: limited.idem(),
      });
      const productId = product.body.data.public_id as string;
      await limited.call("PATCH", `/mgmt/v1/products/${productId}/browser-runtime`, {
        body: { enabled: true, allowed_origins: [APP] },
      });
      for (let i = 0; i < 10; i++) {
        const response = await limited.call("OPTIONS", "/runtime/v1/time", {
          key: null,
          headers: { origin: APP, "access-control-request-method": "POST" },
        });
        expect(response.status).toBe(204);
        expect(response.headers.get("access-control-allow-origin")).toBe(APP);
      }
      const time = () =>
        limited.call("POST", "/runtime/v1/time", {
          key: null,
          body: { product_id: productId, nonce: "n".repeat(22) },
          headers: { origin: APP },
        });
      for (let i = 0; i < 3; i++) expect((await time()).status).toBe(200);
      const refused = await time();
      expect(refused.status).toBe(429);
      expect(refused.headers.get("access-control-allow-origin")).toBe(APP);
      expect(refused.headers.get("retry-after")).not.toBeNull();
      expect(refused.headers.get("access-control-expose-headers")).toContain("Retry-After");
      const preflight = await limited.call("OPTIONS", "/runtime/v1/time", {
        key: null,
        headers: { origin: APP, "access-control-request-method": "POST" },
      });
      expect(preflight.status).toBe(204);
      expect(preflight.headers.get("access-control-allow-origin")).toBe(APP);
    } finally {
      limited.close();
    }
  });
});
