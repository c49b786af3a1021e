import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createApp } from "../../src/app.ts";
import { SIGNED_DENIAL_OPERATIONS } from "../../src/modules/docs/openapi-responses.ts";
import { TestDevice } from "../support/device.ts";
import {
  BASE_URL,
  type CallOptions,
  type CallResult,
  createTestContext,
  type TestContext,
} from "../support/harness.ts";
import { OpenApiTruth } from "../support/openapi-truth.ts";
import { activatedDevice, heartbeatPath, proofCall, runtimeFixture } from "../support/runtime.ts";
import { freshEmail, startTrial } from "../support/trials.ts";

/**
 * The OpenAPI document tells the truth about real answers: each answer below is checked against
 * the operation the document gives for its path, as a client generator would read it (its status
 * declared, its JSON body valid for the declared schema with no member the schema leaves out, and
 * each header the service sent declared for that status).
 */

type Json = Record<string, unknown>;

// biome-ignore lint/suspicious/noExplicitAny: the document is arbitrary JSON read by the assertions.
let doc: any;
let truth: OpenApiTruth;
let t: TestContext;

beforeAll(async () => {
  t = createTestContext();
  doc = (await t.call("GET", "/openapi.json", { key: null })).body;
  truth = new OpenApiTruth(doc);
});
afterAll(() => t.close());

const mismatches = (method: string, url: string, answer: CallResult) => truth.mismatches(method, url, answer);

type Answer = { description?: string; headers?: Json; content?: Record<string, { schema?: Json }> };
type Operation = { parameters?: { in: string; name: string }[]; responses: Record<string, Answer> };
const operations = (): { path: string; method: string; op: Operation }[] =>
  Object.entries(doc.paths as Record<string, Record<string, Operation>>).flatMap(([path, item]) =>
    Object.entries(item).map(([method, op]) => ({ path, method, op })),
  );

/** A call whose answer the document must describe truly. */
async function checked(method: string, url: string, options: CallOptions = {}, on = t): Promise<CallResult> {
  const answer = await on.call(method, url, options);
  expect({ url, problems: mismatches(method, url, answer) }).toEqual({ url, problems: [] });
  return answer;
}

describe("nullable enums", () => {
  test("no schema in the document allows null by its type but leaves null out of its enum or const", () => {
    const contradictions: string[] = [];
    let nullable = 0;
    const walk = (node: unknown, where: string) => {
      if (Array.isArray(node)) for (const [i, item] of node.entries()) walk(item, `${where}/${i}`);
      if (!node || typeof node !== "object" || Array.isArray(node)) return;
      const schema = node as Json;
      if (
        Array.isArray(schema.type) &&
        schema.type.includes("null") &&
        ("enum" in schema || "const" in schema)
      ) {
        nullable++;
        const allowed = "const" in schema ? [schema.const] : (schema.enum as unknown[]);
        if (!allowed.includes(null)) contradictions.push(where);
      }
      for (const [key, value] of Object.entries(schema)) walk(value, `${where}/${key}`);
    };
    walk(doc, "");
    expect(nullable).toBeGreaterThanOrEqual(2);
    expect(contradictions).toEqual([]);
  });

  test("an active activation, whose deactivation_reason is null, is listed as the document says", async () => {
    const fixture = await runtimeFixture(t);
    await activatedDevice(t, fixture);
    const list = await checked("GET", `/mgmt/v1/licenses/${fixture.licenseId}/activations`);
    expect(list.body.data[0].deactivation_reason).toBeNull();
  });

  test("a billing integration never configured, whose provider is null, is answered as the document says", async () => {
    const answer = await checked("GET", "/mgmt/v1/billing-integration");
    expect(answer.body.data.provider).toBeNull();
  });
});

describe("response headers", () => {
  test("every route whose handler sets an ETag declares it on its success answer, and no other route does", () => {
    // The handlers' own text: each sets the header as `etag` (set.headers.etag, or headers { etag }).
    const setting = (t.app.routes as { method: string; path: string; handler: unknown }[])
      .filter((route) => /etag/i.test(String(route.handler)))
      .map((route) => `${route.method.toLowerCase()} ${route.path.replace(/:([A-Za-z_]+)/g, "{$1}")}`);
    const declaring = operations()
      .filter(({ op }) =>
        Object.entries(op.responses).some(([status, answer]) => /^2/.test(status) && answer.headers?.ETag),
      )
      .map(({ method, path }) => `${method} ${path}`);
    expect(setting.length).toBeGreaterThanOrEqual(29);
    expect(declaring.sort()).toEqual(setting.sort());
  });

  test("a product's create, replay, read and change send ETag, Idempotent-Replayed, RateLimit and X-Request-Id as declared", async () => {
    const headers = t.idem();
    const body = { name: "Headers", code: "headers-product" };
    const created = await checked("POST", "/mgmt/v1/products", { body, headers });
    const replayed = await checked("POST", "/mgmt/v1/products", { body, headers });
    expect(replayed.headers.get("idempotent-replayed")).toBe("true");
    const id = created.body.data.public_id;
    const read = await checked("GET", `/mgmt/v1/products/${id}`);
    expect(read.headers.get("etag")).toBe(created.headers.get("etag"));
    const changed = await checked("PATCH", `/mgmt/v1/products/${id}`, {
      body: { name: "Headers 2" },
      headers: { "if-match": read.headers.get("etag") as string },
    });
    expect(changed.headers.get("ratelimit")).not.toBeNull();
    await checked("GET", `/mgmt/v1/products/${id}/browser-runtime`);
    await checked("GET", `/mgmt/v1/products/${id}/trial-signup`);
  });

  test("a license user, a webhook and a reseller send their ETag as declared", async () => {
    const user = await checked("POST", "/mgmt/v1/license-users", {
      body: { email: freshEmail() },
      headers: t.idem(),
    });
    await checked("GET", `/mgmt/v1/license-users/${user.body.data.public_id}`);
    const hook = await checked("POST", "/mgmt/v1/webhooks", {
      body: { url: "https://hooks.example.com/etag", events: ["license.created"] },
      headers: t.idem(),
    });
    await checked("POST", `/mgmt/v1/webhooks/${hook.body.data.public_id}/rotate-secret`, { body: {} });
    await checked("POST", "/mgmt/v1/resellers", { body: { name: "Etag Reseller" }, headers: t.idem() });
  });

  test("a refused management call's 429 carries Retry-After and the RateLimit headers, declared", async () => {
    const limited = createTestContext({ managementRateLimit: { limit: 1, windowSec: 60 } });
    try {
      await checked("GET", "/mgmt/v1/products", {}, limited);
      const refused = await checked("GET", "/mgmt/v1/products", {}, limited);
      expect(refused.status).toBe(429);
      expect(refused.headers.get("retry-after")).not.toBeNull();
    } finally {
      limited.close();
    }
  });

  test("every 429 declares Retry-After and every 503 Retry-After; every answer declares X-Request-Id", () => {
    const missing: string[] = [];
    for (const { method, path, op } of operations())
      for (const [status, answer] of Object.entries(op.responses)) {
        const names = Object.keys(answer.headers ?? {});
        const wanted = ["X-Request-Id", ...(status === "429" || status === "503" ? ["Retry-After"] : [])];
        for (const name of wanted)
          if (!names.includes(name)) missing.push(`${method} ${path} ${status} ${name}`);
      }
    expect(missing).toEqual([]);
    const offline = doc.paths["/mgmt/v1/licenses/{id}/offline-certificates"].post.responses["200"];
    expect(Object.keys(offline.headers)).toEqual(
      expect.arrayContaining(["X-Offline-Package-Id", "Idempotent-Replayed"]),
    );
  });
});

describe("the failure statuses each operation declares", () => {
  test("every operation declares 400 (a query parameter given twice) and 503 (the store unavailable)", async () => {
    const lacking = operations()
      .filter(({ op }) => !op.responses["400"] || !op.responses["503"])
      .map(({ method, path }) => `${method} ${path}`);
    expect(lacking).toEqual([]);
    await checked("GET", "/healthz?a=1&a=2");
    await checked("GET", "/mgmt/v1/plan?a=1&a=2");
  });

  test("every management change and runtime DELETE declares 400, 413 and 422 for the body it reads", () => {
    const lacking = operations()
      .filter(
        ({ method, path }) =>
          (path.startsWith("/mgmt/") && method !== "get") ||
          (path.startsWith("/runtime/") && method === "delete"),
      )
      .flatMap(({ method, path, op }) =>
        ["400", "413", "422"]
          .filter((status) => !op.responses[status])
          .map((status) => `${method} ${path} ${status}`),
      );
    expect(lacking).toEqual([]);
  });

  test("bodies a bodyless management change or a runtime DELETE refuses are answered as declared", async () => {
    const fixture = await runtimeFixture(t);
    const { activationId } = await activatedDevice(t, fixture);
    const json = { "content-type": "application/json" };
    const oversize = JSON.stringify({ filler: "x".repeat(3_000_000) });
    const answers = [
      await checked("DELETE", `/mgmt/v1/policies/${fixture.policyId}`, { rawBody: "{", headers: json }),
      await checked("DELETE", `/mgmt/v1/policies/${fixture.policyId}`, { body: { surprise: 1 } }),
      await checked("POST", `/mgmt/v1/products/${fixture.productId}/sealed-files`, { body: { surprise: 1 } }),
      await checked("POST", `/mgmt/v1/products/${fixture.productId}/sealed-files`, {
        rawBody: oversize,
        headers: json,
      }),
      await checked("DELETE", `/runtime/v1/activations/${activationId}`, {
        key: null,
        rawBody: oversize,
        headers: json,
      }),
    ];
    expect(answers.map((answer) => answer.status)).toEqual([400, 422, 422, 413, 413]);
  });

  test("the error statuses the checker saw answered are declared: a full lease pool, an unknown trial product, an archived product's config, a queued delivery's replay", async () => {
    const fixture = await runtimeFixture(t, { policy: { max_concurrent: 1, concurrency_unit: "instance" } });
    const { device, activationId } = await activatedDevice(t, fixture);
    const lease = (instance: string) =>
      proofCall(t, device, "POST", "/runtime/v1/leases", activationId, {
        activation_id: activationId,
        instance_id: instance,
      });
    expect((await lease("a")).status).toBe(201);
    const full = await lease("b");
    expect([full.status, full.body.error?.code]).toEqual([409, "CONCURRENCY_LIMIT_REACHED"]);
    expect(mismatches("POST", "/runtime/v1/leases", full)).toEqual([]);

    const trial = await startTrial(t, "prd_unknown", freshEmail(), new TestDevice());
    expect(trial.status).toBe(404);
    expect(mismatches("POST", "/runtime/v1/trial-verifications", trial)).toEqual([]);

    const product = await checked("POST", "/mgmt/v1/products", {
      body: { name: "Archived", code: "archived-config" },
      headers: t.idem(),
    });
    const id = product.body.data.public_id;
    await checked("DELETE", `/mgmt/v1/products/${id}`);
    const config = await checked("GET", `/mgmt/v1/products/${id}/integration-config`);
    expect([config.status, config.body.error?.code]).toEqual([409, "PRODUCT_ARCHIVED"]);

    const hook = await checked("POST", "/mgmt/v1/webhooks", {
      body: { url: "https://hooks.example.com/replay" },
      headers: t.idem(),
    });
    const hookId = hook.body.data.public_id;
    // Its own webhook.created delivery, still queued.
    const queued = await checked("GET", `/mgmt/v1/webhooks/${hookId}/deliveries`);
    const replay = await checked(
      "POST",
      `/mgmt/v1/webhooks/${hookId}/deliveries/${queued.body.data[0].id}/replay`,
    );
    expect([replay.status, replay.body.error?.code]).toEqual([422, "INVALID_TRANSITION"]);
  });

  test("/readyz while shutting down answers the 503 it declares", async () => {
    const app = createApp(t.deps, { baseUrl: BASE_URL, readiness: { ready: () => false } });
    const response = await app.handle(new Request(`${BASE_URL}/readyz`));
    const text = await response.text();
    const answer = { status: response.status, headers: response.headers, body: JSON.parse(text), text };
    expect(answer.status).toBe(503);
    expect(mismatches("GET", "/readyz", answer)).toEqual([]);
  });
});

describe("signed denials", () => {
  test("the signing routes declare the signed error envelope for 403 and 410", () => {
    for (const operation of SIGNED_DENIAL_OPERATIONS) {
      const [method, path] = operation.split(" ") as [string, string];
      for (const status of ["403", "410"]) {
        const answer = doc.paths[path][method].responses[status];
        if (!answer) continue;
        expect(`${operation} ${status} ${answer.content["application/json"].schema.$ref}`).toBe(
          `${operation} ${status} #/components/schemas/SignedErrorEnvelope`,
        );
      }
    }
    const envelope = doc.components.schemas.SignedErrorEnvelope;
    expect(envelope.required).toEqual(["error"]);
    expect(Object.keys(envelope.properties).sort()).toEqual(
      ["error", "response_assertion", "response_signature", "signing_delegation"].sort(),
    );
  });

  test("a revoked license's heartbeat and lease, and a second deactivation, answer signed denials as declared", async () => {
    const fixture = await runtimeFixture(t, {
      policy: { max_machines: 2, max_concurrent: 2, concurrency_unit: "instance" },
    });
    const first = await activatedDevice(t, fixture);
    const second = await activatedDevice(t, fixture);
    const deactivate = `/runtime/v1/activations/${second.activationId}`;
    expect((await proofCall(t, second.device, "DELETE", deactivate, second.activationId)).status).toBe(200);
    const gone = await proofCall(t, second.device, "DELETE", deactivate, second.activationId);
    expect([gone.status, gone.body.error?.code]).toEqual([410, "ACTIVATION_DEACTIVATED"]);

    expect((await t.call("DELETE", `/mgmt/v1/licenses/${fixture.licenseId}`)).status).toBe(204);
    const heartbeat = await proofCall(
      t,
      first.device,
      "POST",
      heartbeatPath(first.activationId),
      first.activationId,
      {
        machine_info_digest: "0".repeat(64),
      },
    );
    const lease = await proofCall(t, first.device, "POST", "/runtime/v1/leases", first.activationId, {
      activation_id: first.activationId,
      instance_id: "a",
    });
    for (const [method, path, answer] of [
      ["DELETE", deactivate, gone],
      ["POST", heartbeatPath(first.activationId), heartbeat],
      ["POST", "/runtime/v1/leases", lease],
    ] as const) {
      expect(answer.body.response_signature).toBeString();
      expect(mismatches(method, path, answer)).toEqual([]);
    }
    expect([heartbeat.status, heartbeat.body.error.code]).toEqual([403, "LICENSE_REVOKED"]);
  });

  test("an unsigned 403 on a signing route still fits the declared schema", async () => {
    const fixture = await runtimeFixture(t);
    const { device, activationId } = await activatedDevice(t, fixture);
    // A device block is refused unsigned (protocol §16).
    const blocked = await checked("POST", "/mgmt/v1/device-blocks", {
      body: { kind: "device_key", device_signing_key_thumbprint: device.thumbprint },
    });
    expect(blocked.status).toBe(201);
    const refused = await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
      machine_info_digest: "0".repeat(64),
    });
    expect([refused.status, refused.body.error?.code]).toEqual([403, "DEVICE_BLOCKED"]);
    expect(refused.body.response_signature).toBeUndefined();
    expect(mismatches("POST", heartbeatPath(activationId), refused)).toEqual([]);
  });
});
