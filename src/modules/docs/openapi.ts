import { toOpenAPISchema } from "@elysiajs/openapi";
import type { AnyElysia } from "elysia";
import { DEFAULT_PAGE_SIZE } from "../../http/pagination.ts";
import { ErrorEnvelope } from "../../http/schemas.ts";
import {
  documentResponseHeaders,
  documentSignedDenials,
  errorResponsesFor,
  type Operation,
  RESPONSE_HEADERS,
  SignedErrorEnvelope,
  usesDeviceProof,
} from "./openapi-responses.ts";

export const API_VERSION = "2026-09-21";

type Parameter = NonNullable<Operation["parameters"]>[number];

const METHODS = ["get", "post", "put", "patch", "delete"] as const;

/** The request headers of a device proof besides the signature, which the `deviceProof` scheme names. */
const DEVICE_PROOF_HEADERS = [
  {
    name: "x-service-activation",
    description: "The activation whose device key signs the request.",
    schema: { type: "string" },
  },
  {
    name: "x-service-timestamp",
    description: "Unix seconds on the device; within 300 seconds of the server clock.",
    schema: { type: "string", pattern: "^[0-9]+$" },
  },
  {
    name: "x-service-nonce",
    description: "Unique per activation within the proof window; a replay is refused.",
    schema: { type: "string" },
  },
].map((header) => ({ in: "header", required: true, ...header }));

/**
 * The OpenAPI 3.1 document, generated from the routes themselves and completed with what the
 * generator cannot know: security schemes, the error envelope on every failure status a route can
 * answer (signed on the routes that sign denials), and the headers each answer carries.
 */
export function buildOpenApiDocument(app: AnyElysia, baseUrl: string): Record<string, unknown> {
  const generated = toOpenAPISchema(
    app,
    { paths: [/^\/docs/, "/openapi.json", /^\/testing\//] },
    undefined,
    undefined,
    "3.1.0",
  );
  // A copy: the generator hands out the routes' own `detail` objects, which the steps below complete.
  const paths = JSON.parse(JSON.stringify(generated.paths)) as Record<string, Record<string, Operation>>;
  documentRequestBodies(app, paths);
  documentDeclaredResponses(app, paths);
  for (const [path, item] of Object.entries(paths)) {
    for (const method of METHODS) {
      const operation = item[method];
      if (!operation) continue;
      for (const parameter of operation.parameters ?? []) documentQueryInteger(parameter);
      operation.responses = { ...operation.responses, ...errorResponsesFor(method, path, operation) };
      // Management operations inherit the document's API key; device-proof ones keep their own
      // scheme and list its headers; every other operation is public.
      if (usesDeviceProof(operation))
        operation.parameters = [...(operation.parameters ?? []), ...DEVICE_PROOF_HEADERS];
      else if (!path.startsWith("/mgmt/")) operation.security = [];
      // A DELETE that declares no answer of its own answers 204; one that declares a body (the
      // runtime ones answer 200, signed) must not also claim 204.
      if (method === "delete" && !documentsSuccess(operation)) {
        operation.responses = { "204": { description: "Done; no body." }, ...operation.responses };
      }
      documentSignedDenials(method, path, operation);
      documentResponseHeaders(method, path, operation);
    }
  }
  const schemas = allowNullInNullableEnums(withoutIds(generated.components?.schemas ?? {}));
  return {
    openapi: "3.1.0",
    info: {
      title: "Licensing Service API",
      version: API_VERSION,
      description:
        "Runtime API (`/runtime/v1`) for product apps and Management API (`/mgmt/v1`) for vendors. Every failure answers the error envelope; see /docs/errors.",
    },
    // Relative, so it resolves against wherever the document was fetched from (OpenAPI 3.1
    // §4.8.5): /docs opened at localhost, a LAN address or a tunnel calls that same origin, which
    // its Content-Security-Policy allows, rather than the configured one, which it would refuse.
    servers: [
      { url: new URL(baseUrl).pathname, description: `The service; its configured base URL is ${baseUrl}.` },
    ],
    security: [{ managementApiKey: [] }],
    tags: [
      { name: "Products" },
      { name: "Policies" },
      { name: "Customers" },
      { name: "Licenses" },
      { name: "Resellers" },
      { name: "Events" },
      { name: "Plan and reports" },
      { name: "Health" },
    ],
    paths: allowNullInNullableEnums(paths),
    components: {
      ...generated.components,
      schemas: { ...schemas, ErrorEnvelope, SignedErrorEnvelope },
      headers: RESPONSE_HEADERS,
      securitySchemes: {
        managementApiKey: {
          type: "http",
          scheme: "bearer",
          description:
            "A Management API key (`lsk_live_…` or `lsk_test_…`) sent as `Authorization: Bearer <key>`.",
        },
        deviceProof: {
          type: "apiKey",
          in: "header",
          name: "X-Service-Signature",
          description:
            "Device proof headers (X-Service-Activation, X-Service-Timestamp, X-Service-Nonce, X-Service-Signature); see docs/protocol.md.",
        },
      },
    },
  };
}

/** Whether an operation declares a success answer of its own (a 2xx). */
const documentsSuccess = (operation: Operation) =>
  Object.keys(operation.responses ?? {}).some((status) => /^2\d\d$/.test(status));

/**
 * The component schemas without the `$id` each model carries from its TypeBox definition
 * (`#/components/schemas/<name>`): an `$id` makes a schema its own resource, against which
 * Swagger UI resolves the `$ref`s inside it and finds nothing, so "Try it out" offered `"string"`
 * for every body. References are JSON pointers into the document and need no `$id`.
 */
function withoutIds(schemas: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(schemas).map(([name, schema]) => {
      if (typeof schema !== "object" || schema === null) return [name, schema];
      const { $id: _id, ...rest } = schema as Record<string, unknown>;
      return [name, rest];
    }),
  );
}

/**
 * A query integer as what it is. Elysia's `t.Integer` accepts the query's text and so describes
 * itself as anyOf [a string of format "integer" with default 0, the integer]: Swagger UI then
 * filled in 0, which the service refuses, and client generators read a default of 0. The integer
 * branch carries the real bounds; a list's `limit` defaults to the page size.
 */
function documentQueryInteger(parameter: Parameter): void {
  const anyOf = parameter.schema?.anyOf;
  if (parameter.in !== "query" || !Array.isArray(anyOf)) return;
  const branches = anyOf as Record<string, unknown>[];
  const textual = branches.find((branch) => branch.type === "string" && branch.format === "integer");
  const integer = branches.find((branch) => branch.type === "integer");
  if (!textual || !integer) return;
  parameter.schema = parameter.name === "limit" ? { ...integer, default: DEFAULT_PAGE_SIZE } : { ...integer };
}

/**
 * Our JSON parser is a function hook (it enforces byte and depth limits), and the generator only
 * describes bodies for its named parsers; so the body schema of each route is filled in here. A
 * route whose body may be left out says so with `detail["x-body-optional"]`.
 */
function documentRequestBodies(app: AnyElysia, paths: Record<string, Record<string, Operation>>): void {
  for (const route of app.routes) {
    const body = (route.hooks as { body?: unknown } | undefined)?.body;
    if (body === undefined) continue;
    const path = route.path.replace(/:([A-Za-z_]+)/g, "{$1}");
    const operation = paths[path]?.[route.method.toLowerCase()];
    if (!operation) continue;
    const schema = typeof body === "string" ? { $ref: `#/components/schemas/${body}` } : body;
    const optional = operation["x-body-optional"] === true;
    delete operation["x-body-optional"];
    operation.requestBody = { required: !optional, content: { "application/json": { schema } } };
  }
}

/**
 * The answers a route declares in `detail.responses` (an HTML page's 200, the codes an error status
 * carries there). The generator drops them whenever the route also has a `response` schema (it
 * starts the operation's responses afresh from that), so they are put back here; a status the
 * generator described from the schema keeps its description and content, and takes the headers
 * the route declares for it (the ETag its handler sets).
 */
function documentDeclaredResponses(app: AnyElysia, paths: Record<string, Record<string, Operation>>): void {
  for (const route of app.routes) {
    const declared = (route.hooks as { detail?: { responses?: Operation["responses"] } } | undefined)?.detail
      ?.responses;
    if (!declared) continue;
    const path = route.path.replace(/:([A-Za-z_]+)/g, "{$1}");
    const operation = paths[path]?.[route.method.toLowerCase()];
    if (!operation) continue;
    // Copies: the steps after this one complete the answers, and must not change the route's own.
    const responses = JSON.parse(JSON.stringify(declared)) as NonNullable<Operation["responses"]>;
    for (const [status, generated] of Object.entries(operation.responses ?? {})) {
      const headers = responses[status]?.headers;
      responses[status] = headers
        ? { ...generated, headers: { ...generated.headers, ...headers } }
        : generated;
    }
    operation.responses = responses;
  }
}

/**
 * A copy of `node` in which every schema that allows null by its type also allows it by its
 * enum or const. The generator writes `Nullable(StringEnum([…]))` as `{ type: [string, null],
 * enum: […] }` with no null among the values, which refuses the null it means to allow.
 */
function allowNullInNullableEnums<T>(node: T): T {
  if (Array.isArray(node)) return node.map(allowNullInNullableEnums) as T;
  if (typeof node !== "object" || node === null) return node;
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(node)) out[key] = allowNullInNullableEnums(value);
  if (!Array.isArray(out.type) || !out.type.includes("null")) return out as T;
  if ("const" in out) {
    const { const: only, ...rest } = out;
    return { ...rest, enum: only === null ? [null] : [only, null] } as T;
  }
  if (Array.isArray(out.enum) && !out.enum.includes(null)) out.enum = [...out.enum, null];
  return out as T;
}
