import { Type } from "@sinclair/typebox";
import { ERROR_CODES } from "../../http/errors.ts";
import { classifyRuntimeRequest } from "../../http/runtime-routes.ts";
import { ErrorEnvelope } from "../../http/schemas.ts";
import { SignedEnvelope } from "../activations/model.ts";
import { isPlanReport } from "../plan/plan-route.ts";

/** What the document builder reads of an operation. */
export type Operation = {
  parameters?: { in: string; name: string; schema?: Record<string, unknown> }[];
  requestBody?: unknown;
  responses?: Record<string, Response>;
  security?: unknown;
  [key: string]: unknown;
};

type Response = { description?: string; headers?: Record<string, unknown>; content?: unknown };

export const usesDeviceProof = (operation: Operation) =>
  Array.isArray(operation.security) &&
  operation.security.some((entry) => typeof entry === "object" && entry !== null && "deviceProof" in entry);

/**
 * The response headers the service sends, declared once (components.headers) and referenced by
 * each answer that carries them. Only X-Request-Id and ETag are on every answer they are declared
 * on; the others are there when their condition holds (a replay, a limit in force).
 */
export const RESPONSE_HEADERS = {
  "X-Request-Id": {
    description: "The server's id for this request (`req_…`); equals `error.request_id` in an error.",
    required: true,
    schema: { type: "string" },
  },
  ETag: {
    description: "The resource's strong entity-tag; send it back as If-Match to change it safely.",
    required: true,
    schema: { type: "string" },
  },
  "Idempotent-Replayed": {
    description: "`true` when this is the stored answer of an earlier request with the same Idempotency-Key.",
    schema: { type: "string", enum: ["true"] },
  },
  "Retry-After": {
    description: "Seconds to wait before trying again.",
    schema: { type: "string", pattern: "^[0-9]+$" },
  },
  RateLimit: {
    description: 'The window closest to refusing: `"<policy>";r=<remaining>;t=<seconds to full>`.',
    schema: { type: "string" },
  },
  "RateLimit-Policy": {
    description: 'That window\'s policy: `"<policy>";q=<limit>;w=<window seconds>`.',
    schema: { type: "string" },
  },
  "X-Offline-Package-Id": {
    description: "The package's id, also its file name (`<id>.zip`).",
    schema: { type: "string" },
  },
} as const;

export const headerRef = (name: keyof typeof RESPONSE_HEADERS) => ({ $ref: `#/components/headers/${name}` });

/**
 * The routes that sign license-state denials (docs/protocol.md §16): each found by the guard it
 * calls with a `signedFor` (activations/gate.ts). Lease release checks no license state.
 */
export const SIGNED_DENIAL_OPERATIONS = new Set([
  "post /runtime/v1/activations",
  "post /runtime/v1/activations/{id}/heartbeat",
  "delete /runtime/v1/activations/{id}",
  "post /runtime/v1/leases",
  "post /runtime/v1/leases/{id}/heartbeat",
  "post /runtime/v1/activations/{id}/sealed-file-keys",
  "post /runtime/v1/trial-verifications/{id}/confirm",
]);
/** The statuses a signed denial answers: 403 (LICENSE_*, NAMED_USER_ASSIGNMENT_UNAVAILABLE) and 410. */
const SIGNED_DENIAL_STATUSES = new Set(["403", "410"]);

/**
 * The error envelope with the signature a license-state denial carries beside `error`. The
 * signature members are optional: the same statuses also answer unsigned errors (a 403 for a
 * blocked device), which a client must not trust.
 */
export const SignedErrorEnvelope = Type.Object(
  {
    ...ErrorEnvelope.properties,
    response_assertion: Type.Optional(SignedEnvelope.response_assertion),
    response_signature: Type.Optional(SignedEnvelope.response_signature),
    signing_delegation: Type.Optional(SignedEnvelope.signing_delegation),
  },
  {
    description:
      "The error envelope; a signed denial (docs/protocol.md §16) also carries response_assertion (body_sha256 over JCS(error)), response_signature and signing_delegation.",
  },
);

/**
 * The operations the ended plan refuses with 402 PLAN_ENDED (PlanGate, spec §4.1): every
 * Management and Runtime operation except the plan report.
 */
const planGated = (method: string, path: string) =>
  (path.startsWith("/mgmt/") || path.startsWith("/runtime/")) && !isPlanReport(method.toUpperCase(), path);

/** Limited: management calls per API key, and what the runtime limits class (runtime-routes.ts). */
const rateLimited = (method: string, path: string) =>
  path.startsWith("/mgmt/") || classifyRuntimeRequest(method.toUpperCase(), path) !== null;

const errorResponse = (description: string) => ({
  description,
  content: { "application/json": { schema: { $ref: "#/components/schemas/ErrorEnvelope" } } },
});

/**
 * The failure statuses an operation can answer, derived from what it takes: every failure uses
 * the error envelope, and each status lists the codes it carries.
 */
export function errorResponsesFor(
  method: string,
  path: string,
  operation: Operation,
): Record<string, Response> {
  // Any operation: a query parameter given twice (400), the store busy, locked or full (503,
  // spec §4.1), our own failure (500). /readyz also answers 503 while not ready.
  const statuses = new Set<number>([400, 500, 503]);
  const add = (...codes: number[]) => {
    for (const code of codes) statuses.add(code);
  };
  const header = (name: string) =>
    operation.parameters?.some((p) => p.in === "header" && p.name === name) ?? false;
  const hasQuery = operation.parameters?.some((p) => p.in === "query") ?? false;
  // Nothing else ever answers 429.
  if (rateLimited(method, path)) add(429);
  if (path.startsWith("/mgmt/")) add(401, 403);
  if (planGated(method, path)) add(402);
  if (path.includes("{")) statuses.add(404);
  if (hasQuery) add(422);
  if (operation.requestBody) add(413, 422);
  // Every management change reads a body even where it takes none (refusing a field, 422), and a
  // runtime DELETE reads its JSON body; either refuses unreadable JSON (400) and an oversize one.
  if (
    method !== "get" &&
    (path.startsWith("/mgmt/") || (method === "delete" && path.startsWith("/runtime/")))
  )
    add(413, 422);
  if (header("if-match") || header("idempotency-key")) add(409);
  if (usesDeviceProof(operation)) add(401, 403, 404, 410, 422);
  // 410: an Idempotency-Key replay whose activation was deactivated since (signed).
  if (path === "/runtime/v1/activations") add(401, 403, 404, 409, 410, 422);
  if (path.includes("/trust-bundle") || path === "/runtime/v1/time") add(404, 409);
  const out: Record<string, Response> = {};
  for (const status of [...statuses].sort()) {
    if (operation.responses?.[String(status)]) continue;
    const codes = Object.entries(ERROR_CODES)
      .filter(([, spec]) => spec.status === status)
      .map(([code]) => code);
    out[String(status)] = errorResponse(`Error envelope. Codes with this status: ${codes.join(", ")}.`);
  }
  return out;
}

/**
 * A signing route's 403 and 410 answer the signed error envelope; the description (the codes a
 * route names there) is kept.
 */
export function documentSignedDenials(method: string, path: string, operation: Operation): void {
  if (!SIGNED_DENIAL_OPERATIONS.has(`${method} ${path}`)) return;
  for (const [status, response] of Object.entries(operation.responses ?? {})) {
    if (!SIGNED_DENIAL_STATUSES.has(status)) continue;
    response.content = {
      "application/json": { schema: { $ref: "#/components/schemas/SignedErrorEnvelope" } },
    };
  }
}

/**
 * The headers each answer carries: X-Request-Id on all; the rate-limit headers on a limited
 * operation's answers (any status once the limit has counted the call), with Retry-After on its
 * 429; Retry-After on a 503; Idempotent-Replayed on the success of an operation taking an
 * Idempotency-Key. A route's own (ETag) are kept.
 */
export function documentResponseHeaders(method: string, path: string, operation: Operation): void {
  const idempotent = operation.parameters?.some((p) => p.in === "header" && p.name === "idempotency-key");
  const limited = rateLimited(method, path);
  for (const [status, response] of Object.entries(operation.responses ?? {})) {
    const headers: Record<string, unknown> = { "X-Request-Id": headerRef("X-Request-Id") };
    const success = /^2\d\d$/.test(status);
    if (success && idempotent) headers["Idempotent-Replayed"] = headerRef("Idempotent-Replayed");
    if (status === "429" || status === "503") headers["Retry-After"] = headerRef("Retry-After");
    if (limited) {
      headers.RateLimit = headerRef("RateLimit");
      headers["RateLimit-Policy"] = headerRef("RateLimit-Policy");
    }
    response.headers = { ...headers, ...response.headers };
  }
}
