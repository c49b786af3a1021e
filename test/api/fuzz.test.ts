import { afterAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { ERROR_CODES } from "../../src/http/errors.ts";
import { bodyFor, type HeaderList, headersFor, pathParam, queryFor } from "../support/fuzz-requests.ts";
import { type FuzzContext, type Operation, type Schema, sometimes } from "../support/fuzz-values.ts";
import { BASE_URL, createTestContext } from "../support/harness.ts";
import { activatedDevice, runtimeFixture } from "../support/runtime.ts";
import { runtimeEvents, storeDigest } from "../support/store-digest.ts";
import { seedResources } from "./route-table.ts";

/**
 * Property-based fuzzing of every operation in the OpenAPI document the app serves (so a route
 * added later is fuzzed without touching this file), plus the few routes the document leaves out.
 * Each request is hostile somewhere: path, query, body bytes, content type or headers. Whatever
 * it is, the app must never answer 5xx, every failure must be the six-field error envelope with
 * the request id of the X-Request-Id header, and a refused request must change nothing stored.
 *
 * The seed changes with every run and is printed on failure; FUZZ_SEED=<n> replays a run and
 * FUZZ_RUNS=<n> (default 50 per operation) fuzzes longer; FUZZ_REPORT=1 prints the statuses seen.
 */
const SEED = process.env.FUZZ_SEED ? Number(process.env.FUZZ_SEED) : Math.floor(Math.random() * 2 ** 31);
const RUNS = Number(process.env.FUZZ_RUNS ?? 50);
const ENVELOPE_FIELDS = ["code", "details", "doc_url", "message", "request_id", "retryable"];
const METHODS = ["get", "post", "put", "patch", "delete"];
/**
 * Served but deliberately left out of the OpenAPI document: the document, its viewer, metrics, and
 * the bare address that leads a browser to the viewer.
 */
const UNDOCUMENTED = [
  "GET /",
  "GET /openapi.json",
  "GET /docs",
  "GET /docs/errors",
  "GET /docs/assets/{file}",
  "GET /metrics",
];
const METRICS_TOKEN = "fuzz-metrics-token-0123456789";
/**
 * Routes that answer every request of this store one way before they read any input: the billing
 * webhook has no integration here, so it is 404 before its body (billing-webhook-body.test.ts
 * covers what it does with bodies when one exists).
 */
const GATED_BEFORE_INPUT = new Set(["POST /billing/v1/stripe/webhook"]);

const t = createTestContext({ metricsToken: METRICS_TOKEN });
const seeded = seedResources(t);
const fixture = await runtimeFixture(t);
const { activationId } = await activatedDevice(t, fixture);
// biome-ignore lint/suspicious/noExplicitAny: the OpenAPI document is walked as plain JSON.
const doc: any = (await t.call("GET", "/openapi.json", { key: null })).body;
afterAll(() => {
  t.close();
  if (process.env.FUZZ_REPORT) {
    for (const [route, statuses] of seen) console.log(`${route}: ${[...statuses].sort().join(" ")}`);
  }
});

const ctx: FuzzContext = {
  schemas: doc.components.schemas as Record<string, Schema>,
  ids: [
    ...Object.values(seeded.live),
    ...Object.values(seeded.test),
    fixture.productId,
    fixture.licenseId,
    fixture.licenseKey,
    activationId,
  ],
  // Real names for the one undocumented route with a parameter.
  examples: { file: ["swagger-ui.css", "swagger-ui-bundle.js"] },
  keys: t.keys,
  otherTokens: [METRICS_TOKEN],
};

const templateOf = (elysiaPath: string) => elysiaPath.replace(/:([A-Za-z_]+)/g, "{$1}");

function documentedOperations(): Operation[] {
  const ops: Operation[] = [];
  for (const [path, item] of Object.entries<Record<string, Record<string, unknown>>>(doc.paths)) {
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      const content = (op.requestBody as { content?: Record<string, { schema?: Schema }> } | undefined)
        ?.content;
      ops.push({
        method: method.toUpperCase(),
        path,
        parameters: (op.parameters as Operation["parameters"] | undefined) ?? [],
        body: content?.["application/json"]?.schema,
      });
    }
  }
  return ops;
}

const documented = documentedOperations();
const documentedKeys = new Set(documented.map((op) => `${op.method} ${op.path}`));
const undocumented: Operation[] = t.app.routes
  .map((route) => ({ method: route.method, path: templateOf(route.path), parameters: [] }))
  .filter((op) => !documentedKeys.has(`${op.method} ${op.path}`));
const operations = [...documented, ...undocumented];

interface FuzzRequest {
  method: string;
  url: string;
  headers: HeaderList;
  body: { bytes: Uint8Array; contentType: string | null } | null;
}

function requestFor(op: Operation): fc.Arbitrary<FuzzRequest> {
  const names = [...op.path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1] as string);
  return fc
    .record({
      method: fc.oneof(
        { weight: 12, arbitrary: fc.constant(op.method) },
        { weight: 1, arbitrary: fc.constantFrom("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD") },
      ),
      params: fc.tuple(...names.map((name) => pathParam(ctx, op.path, name))),
      query: queryFor(op, ctx),
      headers: headersFor(op, ctx),
      body: op.body
        ? fc.option(bodyFor(op.body, ctx), { freq: 8, nil: null })
        : sometimes(bodyFor(undefined, ctx), 5, null),
    })
    .map(({ method, params, query, headers, body }) => {
      let path = op.path;
      names.forEach((name, i) => {
        path = path.replace(`{${name}}`, params[i] as string);
      });
      return { method, url: `${BASE_URL}${path}${query}`, headers, body };
    });
}

function describeRequest(request: FuzzRequest): string {
  const body = request.body
    ? `${request.body.contentType} ${Buffer.from(request.body.bytes).toString("utf8").slice(0, 300)}`
    : "no body";
  const headers = request.headers.map(([name, value]) => `${name}: ${value.slice(0, 80)}`).join(" | ");
  return `${request.method} ${request.url.slice(0, 300)}\n  headers: ${headers}\n  body: ${body}`;
}

const seen = new Map<string, Set<number>>();

/**
 * The digest of the store as the last request left it. Nothing but these requests writes to the
 * store, and SQLite's total_changes() grows with every row written (even when rolled back), so the
 * digest is recomputed only after a request that wrote something.
 */
let known = { changes: -1, digest: "" };
function currentDigest(): string {
  const changes = t.deps.sqlite.query<{ n: number }, []>("SELECT total_changes() AS n").get()?.n ?? 0;
  if (changes !== known.changes) known = { changes, digest: storeDigest(t.deps.sqlite) };
  return known.digest;
}

/** One request and every property it must hold; a broken property throws with the request in the message. */
async function check(op: Operation, request: FuzzRequest): Promise<void> {
  const headers = new Headers();
  for (const [name, value] of request.headers) headers.append(name, value);
  const bodyAllowed = request.method !== "GET" && request.method !== "HEAD";
  if (request.body?.contentType && bodyAllowed) headers.set("content-type", request.body.contentType);
  const sent = new Request(request.url, {
    method: request.method,
    headers,
    body: request.body && bodyAllowed ? new Uint8Array(request.body.bytes) : undefined,
  });
  const before = currentDigest();
  const eventsBefore = runtimeEvents(t.deps.sqlite);
  const response = await t.app.handle(sent);
  const text = await response.text();
  const fail = (what: string) => {
    throw new Error(
      `${what}\n  ${describeRequest(request)}\n  answer ${response.status}: ${text.slice(0, 500)}`,
    );
  };
  seen.set(
    `${op.method} ${op.path}`,
    (seen.get(`${op.method} ${op.path}`) ?? new Set()).add(response.status),
  );
  if (response.status >= 500) fail("a 5xx answer");
  if (response.status < 400) return;

  if (request.method !== "HEAD") {
    let envelope: { error?: Record<string, unknown> } | null = null;
    try {
      envelope = JSON.parse(text);
    } catch {
      fail("a failure without a JSON body");
    }
    const error = envelope?.error;
    if (!error || Object.keys(error).sort().join() !== ENVELOPE_FIELDS.join())
      fail("not the six-field envelope");
    if (error?.request_id !== response.headers.get("x-request-id"))
      fail("request_id differs from X-Request-Id");
    const spec = ERROR_CODES[error?.code as keyof typeof ERROR_CODES];
    if (spec?.status !== response.status)
      fail(`code ${String(error?.code)} is not a ${response.status} code`);
  }
  if (currentDigest() !== before) fail("a refused request changed the store");
  // The one write a refusal may make: its own entry in the log of refused runtime calls.
  const requestId = response.headers.get("x-request-id");
  for (const [id, row] of runtimeEvents(t.deps.sqlite)) {
    const old = eventsBefore.get(id);
    if (old && old.occurrences === row.occurrences) continue;
    if (row.last_request_id !== requestId || row.http_status !== response.status) {
      fail(`runtime_events changed for another request or status: ${JSON.stringify(row)}`);
    }
  }
  if ([...eventsBefore.keys()].some((id) => !runtimeEvents(t.deps.sqlite).has(id)))
    fail("runtime events vanished");
}

test("every route the app serves is in the OpenAPI document, except the document, its viewer, metrics and the bare address", () => {
  const served = t.app.routes.map((route) => `${route.method} ${templateOf(route.path)}`).sort();
  expect(served.filter((route) => !documentedKeys.has(route)).sort()).toEqual([...UNDOCUMENTED].sort());
  // And so the fuzzer below walks every served route.
  expect(new Set(operations.map((op) => `${op.method} ${op.path}`))).toEqual(new Set(served));
});

describe.each(operations.map((op) => [`${op.method} ${op.path}`, op] as const))("%s", (name, op) => {
  test(
    "never answers 5xx; failures are the error envelope and change nothing",
    async () => {
      try {
        await fc.assert(
          fc.asyncProperty(requestFor(op), (request) => check(op, request)),
          { seed: SEED, numRuns: RUNS, includeErrorInReport: true },
        );
      } catch (error) {
        throw new Error(`fuzzing ${name} failed; replay with FUZZ_SEED=${SEED}\n${(error as Error).message}`);
      }
      // The fuzzer reached more than one outcome, so it was not stuck at one gate (such as auth).
      // A route that takes nothing (no path, query or body) may rightly answer one way to all, and
      // so may one that refuses everything before it reads its input.
      const takesInput = op.parameters.length > 0 || op.body !== undefined || op.path.includes("{");
      if (takesInput && !GATED_BEFORE_INPUT.has(name)) expect(seen.get(name)?.size ?? 0).toBeGreaterThan(1);
    },
    Math.max(30_000, RUNS * 50),
  );
});

/** Found by this fuzzer: Elysia's error message interpolated such a value and threw (a 500). */
test.each(documented.filter((op) => op.body).map((op) => [`${op.method} ${op.path}`, op] as const))(
  "%s answers an object with its own toString in place of every field without a 5xx",
  async (_name, op) => {
    const schema =
      ctx.schemas[String(op.body?.$ref ?? "").replace("#/components/schemas/", "")] ?? op.body ?? {};
    const fields = Object.keys((schema.properties ?? {}) as object);
    const body = Object.fromEntries(fields.map((field) => [field, { toString: null, valueOf: null }]));
    const path = op.path.replace(/\{[^}]+\}/g, fixture.licenseId);
    const response = await t.call(op.method, path, { body, headers: t.idem() });
    expect(response.status).toBeLessThan(500);
    expect(response.body.error.request_id).toBe(response.headers.get("x-request-id"));
  },
);
