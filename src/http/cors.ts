import { Elysia } from "elysia";
import { routedHook } from "./request-path.ts";

/** What the plugin needs to know; `BrowserOriginCache` answers from memory. */
export interface CorsOrigins {
  /** Allowed by at least one product with the browser runtime enabled. */
  allowedAnywhere(origin: string): boolean;
  allows(productId: string, origin: string): boolean;
  productOfActivation(activationId: string): string | undefined;
}

export const CORS_ALLOW_METHODS = "GET, POST, DELETE";
export const CORS_ALLOW_HEADERS =
  "Content-Type, Idempotency-Key, X-Service-Activation, X-Service-Timestamp, X-Service-Nonce, X-Service-Signature";
/** Every response header a browser client reads: request ids, rate limits, replays, the test clock. */
export const CORS_EXPOSE_HEADERS =
  "X-Request-Id, RateLimit, RateLimit-Policy, Retry-After, Idempotent-Replayed, X-Service-Test-Clock";
/** Short, so that an origin removed from the list stops working within minutes in every browser. */
export const CORS_MAX_AGE_SEC = 600;

const RUNTIME_PREFIX = "/runtime/";
const TRUST_BUNDLE = /^\/runtime\/v1\/products\/([^/]+)\/trust-bundle$/;
const PREFLIGHT_VARY = "Origin, Access-Control-Request-Method, Access-Control-Request-Headers";

/** Requests whose product is named in the body: their Origin waits for the body to be parsed. */
const awaitingBody = new WeakMap<Request, string>();

/**
 * CORS for the Runtime API, from the browser runtime settings of the product a request names
 * (docs/api.md "Browser runtime and CORS"). Nothing outside `/runtime/` ever gets a CORS header.
 *
 * Registered before the HTTP conventions: a preflight (`OPTIONS`) is answered here, in
 * `onRequest`, before request ids, rate limits, quotas, authentication or body parsing, so it
 * costs no allowance. A preflight carries no body, so for routes whose product is in the body it
 * is answered from the Origin alone (allowed when any enabled product lists it); the actual
 * response then gets `Access-Control-Allow-Origin` only when the named product lists the origin.
 */
/** `requestId` gives a preflight the X-Request-Id every response carries (the conventions never see it). */
export function runtimeCors(origins: CorsOrigins, requestId: () => string) {
  const decideFromBody = (
    request: Request,
    body: unknown,
    headers: Record<string, string | number>,
  ): void => {
    const origin = awaitingBody.get(request);
    if (origin === undefined) return;
    awaitingBody.delete(request);
    const productId =
      typeof body === "object" && body !== null && "product_id" in body ? body.product_id : undefined;
    // A body that names no product (unparseable, or no product_id) gets the preflight's rule, so
    // the page can read its own 400; a named product decides for itself.
    if (productId === undefined ? true : typeof productId === "string" && origins.allows(productId, origin))
      allow(headers, origin);
  };

  return new Elysia({ name: "runtime-cors" })
    .onRequest(
      routedHook(({ request, set, path }) => {
        if (!path.startsWith(RUNTIME_PREFIX)) return;
        const origin = request.headers.get("origin");
        if (request.method === "OPTIONS") return preflight(request, path, origin, origins, requestId());
        set.headers.vary = "Origin";
        if (origin === null || !origins.allowedAnywhere(origin)) return;
        const trustProduct = TRUST_BUNDLE.exec(path)?.[1];
        if (trustProduct !== undefined) {
          if (origins.allows(trustProduct, origin)) allow(set.headers, origin);
          return;
        }
        const activationId = request.headers.get("x-service-activation");
        if (activationId) {
          const productId = origins.productOfActivation(activationId);
          if (productId !== undefined && origins.allows(productId, origin)) allow(set.headers, origin);
          return;
        }
        awaitingBody.set(request, origin);
      }),
    )
    .onBeforeHandle({ as: "global" }, ({ request, body, set }) => decideFromBody(request, body, set.headers))
    .onError({ as: "global" }, ({ request, body, set }) => decideFromBody(request, body, set.headers));
}

function allow(headers: Record<string, string | number>, origin: string): void {
  headers["access-control-allow-origin"] = origin;
  headers["access-control-expose-headers"] = CORS_EXPOSE_HEADERS;
}

/** Always 204; only an allowed origin gets the headers that let the browser go on. */
function preflight(
  request: Request,
  path: string,
  origin: string | null,
  origins: CorsOrigins,
  requestId: string,
): Response {
  const headers = new Headers({ vary: PREFLIGHT_VARY, "x-request-id": requestId });
  const trustProduct = TRUST_BUNDLE.exec(path)?.[1];
  const allowed =
    origin !== null &&
    (trustProduct !== undefined ? origins.allows(trustProduct, origin) : origins.allowedAnywhere(origin));
  if (allowed) {
    headers.set("access-control-allow-origin", origin);
    headers.set("access-control-allow-methods", CORS_ALLOW_METHODS);
    headers.set("access-control-allow-headers", CORS_ALLOW_HEADERS);
    headers.set("access-control-max-age", String(CORS_MAX_AGE_SEC));
    // Chromium's Private Network Access: a public page calling an on-prem server on a private address.
    if (request.headers.get("access-control-request-private-network") === "true")
      headers.set("access-control-allow-private-network", "true");
  }
  return new Response(null, { status: 204, headers });
}
