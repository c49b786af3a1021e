import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Validator } from "@seriousme/openapi-schema-validator";
import { POLICY_NUMBER_BOUNDS } from "../../src/domain/policy-rules.ts";
import { SCOPES } from "../../src/domain/scopes.ts";
import { buildOpenApiDocument } from "../../src/modules/docs/openapi.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { activatedDevice, proofCall, runtimeFixture } from "../support/runtime.ts";

type Json = Record<string, unknown>;
type Operation = {
  parameters?: { in: string; name: string; required?: boolean; schema?: Json }[];
  security?: Record<string, unknown>[];
  "x-required-scope"?: string;
  requestBody?: { required?: boolean; content?: Record<string, { schema?: unknown }> };
  responses?: Record<string, { content?: Record<string, { schema?: { $ref?: string } }> }>;
};

const METHODS = ["get", "put", "post", "delete", "options", "head", "patch", "trace"] as const;
const ERROR_ENVELOPE_REF = "#/components/schemas/ErrorEnvelope";

let t: TestContext;
// biome-ignore lint/suspicious/noExplicitAny: the document is arbitrary JSON read by the assertions.
let doc: any;
let contentType: string | null;

beforeAll(async () => {
  t = createTestContext();
  const response = await t.call("GET", "/openapi.json", { key: null });
  expect(response.status).toBe(200);
  contentType = response.headers.get("content-type");
  doc = response.body;
});

afterAll(() => t.close());

const operations = (): { path: string; method: string; op: Operation }[] =>
  Object.entries(doc.paths as Record<string, Record<string, Operation>>).flatMap(([path, item]) =>
    METHODS.filter((m) => item[m] !== undefined).map((method) => ({
      path,
      method,
      op: item[method] as Operation,
    })),
  );

const mgmtRoutes = () =>
  (t.app.routes as { method: string; path: string }[])
    .filter((route) => route.path.startsWith("/mgmt/"))
    .map((route) => ({
      method: route.method.toLowerCase(),
      path: route.path.replace(/:([A-Za-z0-9_]+)/g, "{$1}"),
    }));

describe("the OpenAPI document", () => {
  test("is served as JSON without an API key", () => {
    expect(contentType).toContain("application/json");
    expect(typeof doc).toBe("object");
  });

  test("declares OpenAPI 3.1.0", () => {
    expect(doc.openapi).toBe("3.1.0");
  });

  test("is valid according to an independent OpenAPI 3.1 schema validator", async () => {
    const validator = new Validator();
    const result = await validator.validate(structuredClone(doc) as Json);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    expect(validator.version).toBe("3.1");
  });

  test("the validator used above does reject a broken 3.1 document", async () => {
    const broken = structuredClone(doc) as Json;
    delete broken.info;
    const result = await new Validator().validate(broken);
    expect(result.valid).toBe(false);
  });

  test("every management route the app registers is documented with its method", () => {
    const routes = mgmtRoutes();
    expect(routes.length).toBeGreaterThan(10);
    const missing = routes.filter((r) => doc.paths?.[r.path]?.[r.method] === undefined);
    expect(missing).toEqual([]);
  });

  test("every documented operation corresponds to a route the app registers", () => {
    const registered = new Set(
      (t.app.routes as { method: string; path: string }[]).map(
        (r) => `${r.method.toLowerCase()} ${r.path.replace(/:([A-Za-z0-9_]+)/g, "{$1}")}`,
      ),
    );
    const extra = operations().filter(({ path, method }) => !registered.has(`${method} ${path}`));
    expect(extra).toEqual([]);
  });

  test("every management operation requires the managementApiKey scheme", () => {
    const mgmt = operations().filter(({ path }) => path.startsWith("/mgmt/"));
    expect(mgmt.length).toBeGreaterThan(10);
    for (const { path, method, op } of mgmt) {
      const schemes = (op.security ?? []).flatMap((requirement) => Object.keys(requirement));
      expect({ path, method, schemes }).toEqual({ path, method, schemes: ["managementApiKey"] });
    }
  });

  test("every management operation names a required scope that is a real scope", () => {
    const scopes: readonly string[] = SCOPES;
    for (const { path, method, op } of operations().filter(({ path }) => path.startsWith("/mgmt/"))) {
      const scope = op["x-required-scope"];
      expect({ path, method, known: typeof scope === "string" && scopes.includes(scope) }).toEqual({
        path,
        method,
        known: true,
      });
    }
  });

  test("read operations need a read scope and changing operations need a write or delete scope", () => {
    for (const { path, method, op } of operations().filter(({ path }) => path.startsWith("/mgmt/"))) {
      const scope = op["x-required-scope"] ?? "";
      const expected = method === "get" ? /:read$/ : /:(write|delete)$/;
      expect(`${method} ${path} ${scope}`).toMatch(expected);
    }
  });

  test("every operation documents a 4xx response whose schema is the error envelope; the static pages and health probes only the 400 of a repeated query parameter", () => {
    // No limit refuses these (so no 429), and they take no input to refuse but the query every
    // route checks for a parameter given twice.
    const noClientErrors = [
      "get /healthz",
      "get /readyz",
      "get /billing/v1/claims",
      "get /passkeys/v1/register",
      "get /passkeys/v1/approve",
    ];
    for (const { path, method, op } of operations()) {
      if (noClientErrors.includes(`${method} ${path}`)) {
        expect(Object.keys(op.responses ?? {}).filter((status) => /^4/.test(status))).toEqual(["400"]);
        continue;
      }
      const envelopes = Object.entries(op.responses ?? {}).filter(
        ([status, response]) =>
          /^4\d\d$/.test(status) &&
          response.content?.["application/json"]?.schema?.$ref === ERROR_ENVELOPE_REF,
      );
      expect({ path, method, count: envelopes.length > 0 }).toEqual({ path, method, count: true });
    }
  });

  test("every management operation documents 401 and 403 with the error envelope", () => {
    for (const { path, method, op } of operations().filter(({ path }) => path.startsWith("/mgmt/"))) {
      for (const status of ["401", "403"]) {
        const ref = op.responses?.[status]?.content?.["application/json"]?.schema?.$ref;
        expect(`${method} ${path} ${status} ${ref}`).toBe(
          `${method} ${path} ${status} ${ERROR_ENVELOPE_REF}`,
        );
      }
    }
  });

  test("every operation that takes a request body documents its JSON schema", () => {
    const withBody = operations().filter(({ op }) => op.requestBody !== undefined);
    expect(withBody.length).toBeGreaterThan(0);
    const undocumented = withBody
      .filter(({ op }) => op.requestBody?.content?.["application/json"]?.schema === undefined)
      .map(({ method, path }) => `${method} ${path}`);
    expect(undocumented).toEqual([]);
  });

  test("every integer a request body takes is bounded within ±(2^53−1), so 1e308 never passes", () => {
    const unbounded: string[] = [];
    const seen = new Set<unknown>();
    const walk = (node: unknown, where: string) => {
      if (!node || typeof node !== "object" || seen.has(node)) return;
      seen.add(node);
      const schema = node as Json;
      if (typeof schema.$ref === "string") {
        walk(doc.components?.schemas?.[schema.$ref.replace("#/components/schemas/", "")], where);
        return;
      }
      if (schema.type === "integer" || schema.type === "number") {
        const { minimum, maximum } = schema as { minimum?: number; maximum?: number };
        const safe = (n: number | undefined) => n !== undefined && Math.abs(n) <= Number.MAX_SAFE_INTEGER;
        if (!safe(minimum) || !safe(maximum)) unbounded.push(where);
      }
      // Arrays (anyOf, allOf, …) too: their entries are keyed by index.
      for (const [key, value] of Object.entries(schema)) walk(value, `${where}.${key}`);
    };
    for (const { path, method, op } of operations()) {
      walk(op.requestBody?.content?.["application/json"]?.schema, `${method} ${path}`);
    }
    expect(seen.size).toBeGreaterThan(50);
    expect(unbounded).toEqual([]);
  });

  test("the policy bodies state the numeric bounds the service enforces on every plan", () => {
    const schemaOf = (method: string, path: string): Json => {
      const schema = doc.paths[path]?.[method]?.requestBody?.content?.["application/json"]?.schema as Json;
      const ref = schema?.$ref as string | undefined;
      return ref ? doc.components.schemas[ref.replace("#/components/schemas/", "")] : schema;
    };
    for (const [method, path] of [
      ["post", "/mgmt/v1/policies"],
      ["patch", "/mgmt/v1/policies/{id}"],
    ] as const) {
      const properties = schemaOf(method, path).properties as Record<string, Json>;
      for (const [field, bounds] of Object.entries(POLICY_NUMBER_BOUNDS)) {
        const property = properties[field] as Json & { anyOf?: Json[] };
        // A nullable count is anyOf [integer, null].
        const integer = property.anyOf?.find((branch) => branch.type === "integer") ?? property;
        expect({ where: `${method} ${path} ${field}`, min: integer.minimum, max: integer.maximum }).toEqual({
          where: `${method} ${path} ${field}`,
          ...bounds,
        });
      }
    }
    // The values docs/api.md states.
    expect(POLICY_NUMBER_BOUNDS.max_machines).toEqual({ min: 1, max: 1_000_000 });
    expect(POLICY_NUMBER_BOUNDS.cert_ttl_sec.min).toBe(300);
  });

  test("every request body is required except rotate-secret's, whose absence means the defaults", () => {
    const optional = operations()
      .filter(({ op }) => op.requestBody !== undefined && op.requestBody.required !== true)
      .map(({ method, path }) => `${method} ${path}`);
    expect(optional).toEqual(["post /mgmt/v1/webhooks/{id}/rotate-secret"]);
    expect(JSON.stringify(doc)).not.toContain("x-body-optional");
  });

  test("the device-proof operations require the deviceProof scheme and list its headers; other non-management operations are public", () => {
    const proof = [
      "post /runtime/v1/activations/{id}/heartbeat",
      "delete /runtime/v1/activations/{id}",
      "post /runtime/v1/leases",
      "post /runtime/v1/leases/{id}/heartbeat",
      "delete /runtime/v1/leases/{id}",
      "post /runtime/v1/activations/{id}/sealed-file-keys",
    ];
    const requiring = operations()
      .filter(({ op }) => (op.security ?? []).some((requirement) => "deviceProof" in requirement))
      .map(({ method, path }) => `${method} ${path}`);
    expect(requiring.sort()).toEqual([...proof].sort());
    for (const { method, path, op } of operations()) {
      const parameters = (
        (op as { parameters?: { in: string; name: string; required?: boolean }[] }).parameters ?? []
      )
        .filter((p) => p.in === "header" && p.name.startsWith("x-service-"))
        .map((p) => `${p.name} ${p.required}`);
      if (proof.includes(`${method} ${path}`)) {
        expect(op.security).toEqual([{ deviceProof: [] }]);
        expect(parameters.sort()).toEqual([
          "x-service-activation true",
          "x-service-nonce true",
          "x-service-timestamp true",
        ]);
        expect(op.responses?.["401"]).toBeDefined();
      } else {
        expect(parameters).toEqual([]);
        if (!path.startsWith("/mgmt/"))
          expect({ where: `${method} ${path}`, security: op.security }).toEqual({
            where: `${method} ${path}`,
            security: [],
          });
      }
    }
    expect(doc.components.securitySchemes.deviceProof).toMatchObject({
      in: "header",
      name: "X-Service-Signature",
    });
  });

  test("every operation the ended plan refuses documents 402 PLAN_ENDED; the plan report and public routes do not", () => {
    const gated = operations().filter(
      ({ method, path }) =>
        (path.startsWith("/mgmt/") || path.startsWith("/runtime/")) &&
        !(method === "get" && path === "/mgmt/v1/plan"),
    );
    expect(gated.length).toBeGreaterThan(50);
    for (const { method, path, op } of gated) {
      const answer = op.responses?.["402"] as {
        description?: string;
        content?: Record<string, { schema?: { $ref?: string } }>;
      };
      expect({
        where: `${method} ${path}`,
        ref: answer?.content?.["application/json"]?.schema?.$ref,
      }).toEqual({
        where: `${method} ${path}`,
        ref: ERROR_ENVELOPE_REF,
      });
      expect(answer.description).toContain("PLAN_ENDED");
    }
    expect(doc.paths["/mgmt/v1/plan"].get.responses["402"]).toBeUndefined();
    for (const [method, path] of [
      ["get", "/healthz"],
      ["post", "/billing/v1/claims/redeem"],
      ["post", "/passkeys/v1/register"],
    ] as const)
      expect(doc.paths[path][method].responses["402"]).toBeUndefined();
  });

  test("managementApiKey is an HTTP bearer security scheme", () => {
    const scheme = doc.components?.securitySchemes?.managementApiKey;
    expect(scheme?.type).toBe("http");
    expect(scheme?.scheme?.toLowerCase()).toBe("bearer");
  });

  test("the ErrorEnvelope schema requires an error object with all six envelope fields", () => {
    const envelope = doc.components?.schemas?.ErrorEnvelope;
    expect(envelope?.type).toBe("object");
    expect(envelope?.required).toContain("error");
    const error = envelope?.properties?.error;
    const fields = ["code", "message", "request_id", "retryable", "doc_url", "details"];
    expect(Object.keys(error?.properties ?? {}).sort()).toEqual([...fields].sort());
    expect([...(error?.required ?? [])].sort()).toEqual([...fields].sort());
    expect(error.properties.retryable.type).toBe("boolean");
    expect(error.properties.details.type).toBe("object");
  });

  test("every reference in the document (schemas, headers) resolves to a component", () => {
    const refs = new Set<string>();
    const walk = (node: unknown) => {
      if (Array.isArray(node)) node.forEach(walk);
      else if (node && typeof node === "object") {
        for (const [k, v] of Object.entries(node)) {
          if (k === "$ref" && typeof v === "string") refs.add(v);
          else walk(v);
        }
      }
    };
    walk(doc.paths);
    const unresolved = [...refs].filter((ref) => {
      const [, kind, name] = /^#\/components\/(schemas|headers)\/([^/]+)$/.exec(ref) ?? [];
      return kind === undefined || doc.components?.[kind]?.[name as string] === undefined;
    });
    expect([...refs].filter((ref) => ref.startsWith("#/components/headers/")).length).toBeGreaterThan(0);
    expect(unresolved).toEqual([]);
  });

  test("the document does not describe the documentation routes themselves", () => {
    expect(Object.keys(doc.paths).filter((p) => p.startsWith("/docs") || p === "/openapi.json")).toEqual([]);
  });
});

describe("what Swagger UI and client generators read from the document", () => {
  const componentOf = (schema: Json | undefined): Json | undefined =>
    typeof schema?.$ref === "string"
      ? doc.components.schemas[schema.$ref.replace("#/components/schemas/", "")]
      : schema;

  test("no schema in the document carries an $id, so every $ref resolves against the document itself", () => {
    const withId: string[] = [];
    const walk = (node: unknown, where: string) => {
      if (Array.isArray(node)) {
        for (const [i, item] of node.entries()) walk(item, `${where}[${i}]`);
      } else if (node && typeof node === "object")
        for (const [key, value] of Object.entries(node)) {
          if (key === "$id") withId.push(where);
          else walk(value, `${where}.${key}`);
        }
    };
    walk(doc, "");
    expect(Object.keys(doc.components.schemas).length).toBeGreaterThan(50);
    expect(withId).toEqual([]);
  });

  test("every request body resolves to an object schema, directly or through a $ref", () => {
    const bodies = operations().filter(({ op }) => op.requestBody !== undefined);
    expect(bodies.length).toBeGreaterThan(20);
    for (const { method, path, op } of bodies) {
      const schema = componentOf(op.requestBody?.content?.["application/json"]?.schema as Json);
      expect({ where: `${method} ${path}`, type: schema?.type }).toEqual({
        where: `${method} ${path}`,
        type: "object",
      });
    }
    const product = componentOf(
      doc.paths["/mgmt/v1/products"].post.requestBody.content["application/json"].schema,
    );
    expect(Object.keys(product?.properties as Json)).toEqual(
      expect.arrayContaining(["name", "code", "environment"]),
    );
  });

  test("machine_signals states its name and value bounds, and its key pattern matches every name so each value is checked", () => {
    for (const path of ["/runtime/v1/activations", "/runtime/v1/trial-verifications/{id}/confirm"]) {
      const body = componentOf(doc.paths[path].post.requestBody.content["application/json"].schema);
      const signals = (body?.properties as Record<string, Json> | undefined)?.machine_signals as Json;
      expect({ path, ...signals }).toMatchObject({
        path,
        type: "object",
        maxProperties: 32,
        propertyNames: { minLength: 1, maxLength: 64 },
        patternProperties: { "^[\\s\\S]*$": { type: "string", maxLength: 256 } },
      });
      expect(new RegExp(Object.keys(signals.patternProperties as Json)[0] as string).test("a\nb")).toBe(true);
    }
  });

  test("every list operation takes limit as an integer of 1 to 200 defaulting to 50, the bounds the service enforces", () => {
    const lists = operations().filter(({ op }) => {
      const ok = componentOf(op.responses?.["200"]?.content?.["application/json"]?.schema as Json);
      return (ok?.properties as Json | undefined)?.pagination !== undefined;
    });
    const routesTakingLimit = (t.app.routes as { hooks?: { query?: { properties?: Json } } }[]).filter(
      (route) => route.hooks?.query?.properties?.limit !== undefined,
    );
    expect(lists.length).toBe(routesTakingLimit.length);
    expect(lists.length).toBeGreaterThanOrEqual(14);
    for (const { method, path, op } of lists) {
      const limit = op.parameters?.find((p) => p.in === "query" && p.name === "limit");
      const { description: _description, ...schema } = limit?.schema ?? {};
      expect({ where: `${method} ${path}`, required: limit?.required, schema }).toEqual({
        where: `${method} ${path}`,
        required: false,
        schema: { type: "integer", minimum: 1, maximum: 200, default: 50 },
      });
    }
  });

  test("no parameter offers a value the service refuses: no default 0 and no integer spelled as a string", () => {
    const suspicious = operations().flatMap(({ method, path, op }) =>
      (op.parameters ?? [])
        .filter((p) => {
          const text = JSON.stringify(p.schema ?? {});
          return (
            p.schema?.anyOf !== undefined ||
            text.includes('"default":0') ||
            text.includes('"format":"integer"')
          );
        })
        .map((p) => `${method} ${path} ${p.in} ${p.name}`),
    );
    expect(suspicious).toEqual([]);
  });

  test("the server is the base URL's path, relative, so calls go to the origin the document was read from", () => {
    expect(doc.servers).toEqual([{ url: "/", description: expect.stringContaining(BASE_URL) }]);
  });

  test("a base URL with a path (behind a reverse proxy) gives that path as the server", () => {
    const proxied = buildOpenApiDocument(t.app, "https://licensing.example.com/licensing") as {
      servers: Json[];
    };
    expect(proxied.servers).toEqual([
      { url: "/licensing", description: expect.stringContaining("https://licensing.example.com/licensing") },
    ]);
  });

  test("no operation documents both 200 and 204", () => {
    const both = operations()
      .filter(({ op }) => op.responses?.["200"] !== undefined && op.responses?.["204"] !== undefined)
      .map(({ method, path }) => `${method} ${path}`);
    expect(both).toEqual([]);
  });

  test("the runtime DELETEs document the 200 with a signed body they answer; a management DELETE its 204", async () => {
    const successes = (method: string, path: string) =>
      Object.keys(doc.paths[path][method].responses).filter((status) => /^2\d\d$/.test(status));
    const fixture = await runtimeFixture(t, { policy: { max_concurrent: 1, concurrency_unit: "instance" } });
    const { device, activationId } = await activatedDevice(t, fixture);
    const lease = await proofCall(t, device, "POST", "/runtime/v1/leases", activationId, {
      activation_id: activationId,
      instance_id: "instance-a",
    });
    expect(lease.status).toBe(201);
    const released = await proofCall(
      t,
      device,
      "DELETE",
      `/runtime/v1/leases/${lease.body.data.lease_id}`,
      activationId,
      {
        instance_id: "instance-a",
      },
    );
    const deactivated = await proofCall(
      t,
      device,
      "DELETE",
      `/runtime/v1/activations/${activationId}`,
      activationId,
    );
    const webhook = await t.call("POST", "/mgmt/v1/webhooks", {
      body: { url: "https://hooks.example.com/licensing", events: ["license.created"] },
      headers: t.idem(),
    });
    expect(webhook.status).toBe(201);
    const deleted = await t.call("DELETE", `/mgmt/v1/webhooks/${webhook.body.data.public_id}`);
    expect({
      lease: { answered: released.status, documented: successes("delete", "/runtime/v1/leases/{id}") },
      activation: {
        answered: deactivated.status,
        documented: successes("delete", "/runtime/v1/activations/{id}"),
      },
      webhook: { answered: deleted.status, documented: successes("delete", "/mgmt/v1/webhooks/{id}") },
    }).toEqual({
      lease: { answered: 200, documented: ["200"] },
      activation: { answered: 200, documented: ["200"] },
      webhook: { answered: 204, documented: ["204"] },
    });
    expect(released.body.response_assertion).toBeDefined();
    expect(deactivated.body.response_assertion).toBeDefined();
  });
});

describe("the failure answers each operation documents", () => {
  const statuses = (method: string, path: string) => Object.keys(doc.paths[path][method].responses);

  test("every response a route declares in detail.responses is in the document, also beside a response schema", () => {
    const routes = (
      t.app.routes as { method: string; path: string; hooks?: { detail?: { responses?: Json } } }[]
    ).filter((route) => route.hooks?.detail?.responses !== undefined);
    expect(routes.length).toBeGreaterThan(10);
    const missing = routes.flatMap((route) => {
      const path = route.path.replace(/:([A-Za-z_]+)/g, "{$1}");
      const documented = doc.paths[path]?.[route.method.toLowerCase()]?.responses ?? {};
      return Object.entries(route.hooks?.detail?.responses ?? {})
        .filter(([status, answer]) => {
          const description = (answer as { description?: string }).description;
          return /^2/.test(status)
            ? documented[status] === undefined
            : documented[status]?.description !== description;
        })
        .map(([status]) => `${route.method} ${path} ${status}`);
    });
    expect(missing).toEqual([]);
  });

  test("the passkey pages are documented as HTML, and are not rate limited", () => {
    for (const path of ["/passkeys/v1/register", "/passkeys/v1/approve"]) {
      expect(doc.paths[path].get.responses["200"].content["text/html"]).toBeDefined();
      expect(statuses("get", path)).not.toContain("429");
    }
  });

  test.each([
    ["post", "/passkeys/v1/register/options", ["200", "400", "404", "413", "422", "429", "500", "503"]],
    ["post", "/passkeys/v1/register", ["201", "400", "404", "413", "422", "429", "500", "503"]],
    ["post", "/passkeys/v1/approve/options", ["200", "400", "403", "410", "413", "422", "429", "500", "503"]],
    ["post", "/passkeys/v1/approve", ["200", "400", "401", "403", "410", "413", "422", "429", "500", "503"]],
    [
      "post",
      "/mgmt/v1/license-users/{id}/two-factor/passkeys/registration-link",
      ["201", "400", "401", "402", "403", "404", "413", "422", "429", "500", "503"],
    ],
    [
      "post",
      "/mgmt/v1/license-users/{id}/two-factor/totp",
      ["201", "400", "401", "402", "403", "404", "409", "413", "422", "429", "500", "503"],
    ],
    [
      "post",
      "/runtime/v1/email-verifications",
      ["202", "400", "402", "403", "404", "413", "422", "429", "500", "503"],
    ],
    [
      "post",
      "/runtime/v1/email-verifications/{verification_id}/confirm",
      ["200", "400", "401", "402", "403", "404", "410", "413", "422", "429", "500", "503"],
    ],
  ] as const)("%s %s documents %j", (method, path, expected) => {
    expect(statuses(method, path).sort()).toEqual([...expected]);
  });

  test("the codes a status carries are named where the route says them", () => {
    const approve = doc.paths["/passkeys/v1/approve"].post.responses;
    expect(approve["401"].description).toContain("TWO_FACTOR_INVALID");
    expect(approve["403"].description).toContain("TWO_FACTOR_LOCKED");
    expect(approve["410"].description).toContain("EMAIL_VERIFICATION_EXPIRED");
    const confirm = doc.paths["/runtime/v1/email-verifications/{verification_id}/confirm"].post.responses;
    for (const code of ["EMAIL_VERIFICATION_CODE_INVALID", "TWO_FACTOR_REQUIRED", "TWO_FACTOR_INVALID"])
      expect(confirm["401"].description).toContain(code);
    for (const code of [
      "NAMED_USER_ASSIGNMENT_UNAVAILABLE",
      "TWO_FACTOR_LOCKED",
      "PLAN_ENTITLEMENT_REQUIRED",
    ])
      expect(confirm["403"].description).toContain(code);
  });

  test("only what a limit can refuse documents 429: management and runtime calls and the served pages' calls", () => {
    const with429 = operations()
      .filter(({ op }) => op.responses?.["429"] !== undefined)
      .map(({ method, path }) => `${method} ${path}`);
    const limited = (entry: string) =>
      / \/mgmt\//.test(entry) ||
      / \/runtime\//.test(entry) ||
      /^post \/passkeys\//.test(entry) ||
      entry === "post /billing/v1/claims/redeem";
    expect(with429.filter((entry) => !limited(entry))).toEqual([]);
    const all = operations().map(({ method, path }) => `${method} ${path}`);
    expect(all.filter(limited).filter((entry) => !with429.includes(entry))).toEqual([]);
  });
});
