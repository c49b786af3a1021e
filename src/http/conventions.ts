import { Elysia } from "elysia";
import type { Clock } from "../domain/clock.ts";
import type { IdGenerator } from "../domain/ids.ts";
import type { Scope } from "../domain/scopes.ts";
import type { ApiKeyService } from "../modules/api-keys/service.ts";
import { bearerToken, insufficientScope } from "./auth.ts";
import { bodyLimitFor, parseJsonBody, refuseUnexpectedBody, textRuleFor } from "./body.ts";
import { addressPartition, clientAddress } from "./client-address.ts";
import { type ErrorEnvelope, errorBody, isStoreDamage, toApiError } from "./envelope.ts";
import { ApiError, type SignedFor } from "./errors.ts";
import type { Logger } from "./logger.ts";
import { checkQuery } from "./pagination.ts";
import type { GcraLimiter } from "./rate-limit.ts";
import { queryIndexHook, routedHook } from "./request-path.ts";
import { type RequestState, requestState } from "./request-state.ts";

export interface ConventionDeps {
  clock: Clock;
  ids: IdGenerator;
  apiKeys: ApiKeyService;
  logger: Logger;
  managementLimiter: GcraLimiter;
  /** The monthly allowance of the workspace plan; counts each admitted management request. */
  managementQuota?: { admit(method: string, path: string, now: Date): void };
  /** 402 once the workspace plan has ended: after authentication, before any limit counts the request. */
  planGate?: { admit(method: string, path: string, now: Date): void };
  baseUrl: string;
  testClock: boolean;
  /** Whether the client's address is X-Forwarded-For's last entry (client-address.ts): large-body slots per address. */
  trustForwardedFor?: boolean;
  /** The scope a route requires (from its `scope` macro), so it can be checked before the body is read. */
  requiredScope?: (method: string, route: string) => string | undefined;
  /** Whether a route is a list taking `limit` and `cursor`, whose paging parameters are checked as sent. */
  pagedRoute?: (method: string, route: string) => boolean;
  /** Whether a route takes a body by its method but has no body schema (its body must be empty or `{}`). */
  bodylessRoute?: (method: string, route: string) => boolean;
  /** Signs a license-state denial so the device can trust it (DESIGN §5). */
  signDenial?: (
    signedFor: SignedFor,
    requestId: string,
    status: number,
    error: ErrorEnvelope["error"],
  ) => object;
}

const MANAGEMENT_PREFIX = "/mgmt/";

/**
 * Everything every route shares, in one place: request ids, management authentication and rate
 * limits (before the body is read, so an anonymous caller learns nothing about the route), the
 * JSON body parser with its byte limit, and the error envelope for every failure.
 */
export function httpConventions(deps: ConventionDeps) {
  /** The scope an authenticated caller lacks for this route, if any (the route's macro refuses it next). */
  const missingScope = (state: RequestState | undefined, method: string, route: string) => {
    const scope = deps.requiredScope?.(method, route);
    return scope && state?.caller && !state.caller.scopes.has(scope as Scope) ? scope : undefined;
  };
  return new Elysia({ name: "http-conventions" })
    .onRequest(
      routedHook(({ request, set, path }) => {
        const now = deps.clock.now();
        const requestId = deps.ids.next("request", now.getTime());
        requestState.set(request, { requestId, startedAt: performance.now() });
        set.headers["x-request-id"] = requestId;
        // Every answer: no browser guesses a type other than the one we declare.
        set.headers["x-content-type-options"] = "nosniff";
        if (deps.testClock) set.headers["x-service-test-clock"] = "1";
        if (path.startsWith(MANAGEMENT_PREFIX)) authenticate(request, path, set.headers, deps, now);
      }),
    )
    .onParse({ as: "global" }, ({ request, path, route }) => {
      const state = requestState.get(request);
      // A caller without the route's scope hears 403 before its body is read, parsed or measured.
      const scope = missingScope(state, request.method, route);
      if (scope) throw insufficientScope(scope);
      const parsed = parseJsonBody(
        request,
        bodyLimitFor(path),
        (bytes) => {
          if (state) state.rawBody = bytes;
        },
        textRuleFor(path),
        () => addressPartition(clientAddress.of(request, deps.trustForwardedFor ?? false)),
      );
      return deps.bodylessRoute?.(request.method, route) ? parsed.then(refuseUnexpectedBody) : parsed;
    })
    .onTransform(
      { as: "global" },
      queryIndexHook(({ request, route, qi }) => {
        // Most requests (a device's heartbeat) have no query, and cost no more than this one test.
        const at = qi ?? request.url.indexOf("?");
        if (at === -1) return;
        // Before a list route's query schema coerces `limit` (pagination.ts), but only for a caller
        // the route's own check (auth.ts, next) lets in: others hear 401 or 403, learning nothing.
        // Management routes without a caller were refused in onRequest; other routes have none.
        const state = requestState.get(request);
        if (state?.caller && missingScope(state, request.method, route)) return;
        checkQuery(
          request.url.slice(at + 1),
          request.method === "GET" && (deps.pagedRoute?.(request.method, route) ?? false),
        );
      }),
    )
    .onError({ as: "global" }, ({ error, code, request, set }) => {
      const apiError = toApiError(error, code, request);
      const state = requestState.get(request);
      const requestId = state?.requestId ?? "req_unknown";
      // Read once the answer is final: the runtime allowance depends on the code (runtime-limits.ts).
      if (state) state.errorCode = apiError.code;
      // No route: no mapResponse will settle a runtime request's allowance place. Elysia passes
      // a thrown ApiError's own code too: a routed operation's 404 (an unknown product or
      // activation) is answered by its route, mapped and counted like any other answer.
      if (code === "NOT_FOUND" && !(error instanceof ApiError)) state?.finishUnrouted?.(request);
      if (apiError.code === "INTERNAL_ERROR" && isStoreDamage(error)) {
        deps.logger.log("error", "store damaged", {
          request_id: requestId,
          error: (error as Error).message,
          // docs/operations.md, "Backups and restore": backup runs the integrity check.
          advice:
            "the store file is damaged: stop the service, check it with `licensing backup`, and restore the last good backup",
        });
      } else if (apiError.code === "INTERNAL_ERROR") {
        deps.logger.log("error", "unhandled error", {
          request_id: requestId,
          error: error instanceof Error ? error.message : String(error),
          stack: error instanceof Error ? error.stack : undefined,
        });
      }
      for (const [name, value] of Object.entries(apiError.headers)) set.headers[name] = value;
      set.headers["content-type"] = "application/json";
      const body = errorBody(apiError, requestId, deps.baseUrl);
      // The denial names whom it is for inside the signed error object (protocol §16).
      const subject = apiError.signedFor?.subject;
      if (subject) body.error.details = { ...body.error.details, ...subject };
      const signed =
        apiError.signedFor && deps.signDenial
          ? deps.signDenial(apiError.signedFor, requestId, apiError.status, body.error)
          : {};
      return new Response(JSON.stringify({ ...body, ...signed }), { status: apiError.status });
    });
}

function authenticate(
  request: Request,
  path: string,
  headers: Record<string, string | number>,
  deps: ConventionDeps,
  now: Date,
): void {
  const authorization = request.headers.get("authorization");
  const token = bearerToken(authorization);
  const caller = token ? deps.apiKeys.authenticate(token) : null;
  if (!caller) {
    // Only a Bearer token that matches no live key is "not valid": a bare key, Basic or any other
    // scheme may carry a good key in the wrong form, so it hears how to send one.
    throw new ApiError(
      "UNAUTHENTICATED",
      token ? "The API key is not valid." : "Send an API key as 'Authorization: Bearer <key>'.",
      {},
      { headers: { "www-authenticate": 'Bearer realm="mgmt"' } },
    );
  }
  deps.planGate?.admit(request.method, path, now);
  const decision = deps.managementLimiter.check(caller.id, now.getTime());
  Object.assign(headers, deps.managementLimiter.headers(decision));
  if (!decision.allowed) {
    throw new ApiError("RATE_LIMITED", "Too many management requests for this API key.", {
      policy: deps.managementLimiter.policy.name,
      limit: deps.managementLimiter.policy.limit,
      window_sec: deps.managementLimiter.policy.windowSec,
      retry_after_sec: decision.retryAfterSec,
    });
  }
  deps.managementQuota?.admit(request.method, path, now);
  const state = requestState.get(request);
  if (state) state.caller = caller;
}
