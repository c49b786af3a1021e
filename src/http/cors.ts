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
/** The trust bundle's route as registered: its product is the one in the path. */
export const TRUST_BUNDLE_ROUTE = "/runtime/v1/products/:product_id/trust-bundle";
/**
 * Only for preflights, answered before the request is routed: the path of the bundle, with the one
 * trailing slash the router also serves it under. Actual requests decide on the routed route.
 */
const TRUST_BUNDLE_PATH = /^\/runtime\/v1\/products\/([^/]+)\/trust-bundle\/?$/;
const PREFLIGHT_VARY = "Origin, Access-Control-Request-Method, Access-Control-Request-Headers";

/** Runtime requests from a listed origin: their Origin waits until the request is routed. */
const awaitingRoute = new WeakMap<Request, string>();

/**
 * The routes that authenticate by device proof (their `security` names `deviceProof`), keyed by
 * method and template: their product is the one of the activation in `X-Service-Activation`.
 */
export function deviceProofRoutes(routes: readonly { method: string; path: string; hooks: unknown }[]) {
  const proof = new Set<string>();
  for (const route of routes) {
    const security = (route.hooks as { detail?: { security?: unknown } } | undefined)?.detail?.security;
    if (
      Array.isArray(security) &&
      security.some((entry) => typeof entry === "object" && entry && "deviceProof" in entry)
    )
      proof.add(`${route.method} ${route.path}`);
  }
  return (method: string, route: string) => proof.has(`${method} ${route}`);
}

/**
 * CORS for the Runtime API, from the browser runtime settings of the product a request names
 * (docs/api.md "Browser runtime and CORS"). Nothing outside `/runtime/` ever gets a CORS header.
 *
 * Registered before the HTTP conventions: a preflight (`OPTIONS`) is answered here, in
 * `onRequest`, before request ids, rate limits, quotas, authentication or body parsing, so it
 * costs no allowance. A preflight carries no body, so for routes whose product is in the body it
 * is answered from the Origin alone (allowed when any enabled product lists it); the actual
 * response then gets `Access-Control-Allow-Origin` only when the named product lists the origin.
 *
 * An actual request is decided once routed, by its route: the trust bundle by the product in its
 * path, the device-proof routes (`deviceProofRoute`) by the activation in `X-Service-Activation`,
 * every other route by the `product_id` of its body. The activation header is never consulted on
 * a route that names its product in the body, so a page of product A cannot read product B's
 * answer by adding one of A's activations. An answer given before the request is routed (a 404,
 * or a limit's 429 or 402) names no product and follows the preflight's rule.
 */
/** `requestId` gives a preflight the X-Request-Id every response carries (the conventions never see it). */
export function runtimeCors(
  origins: CorsOrigins,
  requestId: () => string,
  deviceProofRoute: (method: string, route: string) => boolean,
) {
  const decide = (
    request: Request,
    route: string | undefined,
    params: Record<string, string | undefined> | undefined,
    body: unknown,
    headers: Record<string, string | number>,
  ): void => {
    const origin = awaitingRoute.get(request);
    if (origin === undefined) return;
    awaitingRoute.delete(request);
    let productId: unknown;
    if (route === TRUST_BUNDLE_ROUTE) productId = params?.product_id;
    else if (route !== undefined && route !== "" && deviceProofRoute(request.method, route)) {
      const activationId = request.headers.get("x-service-activation");
      // An unknown activation names a product no origin is allowed for.
      if (activationId) productId = origins.productOfActivation(activationId) ?? null;
    } else if (typeof body === "object" && body !== null && "product_id" in body) productId = body.product_id;
    // A request that names no product (a body that is unreadable or has no product_id, a proof
    // call without its activation, an answer before routing) gets the preflight's rule, so the
    // page can read its own 400; a named product decides for itself.
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
        awaitingRoute.set(request, origin);
      }),
    )
    .onBeforeHandle({ as: "global" }, ({ request, route, params, body, set }) =>
      decide(request, route, params, body, set.headers),
    )
    .onError({ as: "global" }, ({ request, route, params, body, set }) =>
      decide(request, route, params, body, set.headers),
    );
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
  const headers = new Headers({
    vary: PREFLIGHT_VARY,
    "x-request-id": requestId,
    "x-content-type-options": "nosniff",
  });
  const trustProduct = TRUST_BUNDLE_PATH.exec(path)?.[1];
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
