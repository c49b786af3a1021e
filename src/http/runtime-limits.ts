import { Elysia } from "elysia";
import type { Clock } from "../domain/clock.ts";
import { addressPartition, clientAddress } from "./client-address.ts";
import { ApiError, type ErrorCode } from "./errors.ts";
import {
  GcraLimiter,
  type RateLimitDecision,
  type RateLimitSetting,
  type RuntimeRateLimitSettings,
} from "./rate-limit.ts";
import { requestState } from "./request-state.ts";
import { classifyRuntimeRequest, type RuntimeMetering } from "./runtime-routes.ts";

/** What a runtime request that got through is charged and counted against once answered. */
export interface RuntimeAdmission {
  metering: RuntimeMetering;
  at: Date;
  /** Device-proof calls only: the buckets to charge once the answer shows the proof verified. */
  device?: { address: string; activationId: string | null; licenseId: string | null };
}

export interface RuntimeLimitDeps {
  clock: Clock;
  limits: RuntimeRateLimitSettings;
  trustForwardedFor: boolean;
  /** 402 once the workspace plan has ended. */
  planGate: { admit(method: string, path: string, now: Date): void };
  /** The monthly Runtime allowance. */
  quota: { check(now: Date): void; count(now: Date): void };
  /** The license an activation belongs to (it never changes), or null for an unknown activation. */
  licenseOf(activationId: string): string | null;
}

/**
 * Answers of a device-proof route that say nothing about who sent the request: malformed or
 * missing proof headers, a body refused before the proof is checked, an unknown activation, a
 * proof that does not verify. They are charged to the sender's address, never to the activation
 * the headers name, so nobody can use up a device's window by sending requests in its name.
 */
const UNPROVEN: ReadonlySet<string> = new Set<ErrorCode>([
  "INVALID_REQUEST",
  "VALIDATION_FAILED",
  "PAYLOAD_TOO_LARGE",
  "NOT_FOUND",
  "DEVICE_PROOF_INVALID",
  "CLOCK_SKEW",
]);

/** Activation ids are short; a longer header is not one and is not looked up. */
const MAX_ACTIVATION_ID = 64;

/**
 * Whether an answered runtime request counts toward the monthly Runtime allowance (spec §4.2 rules
 * 1, 10 and 12, §8). Refusals by the limits themselves (429) and by an ended plan (402) do not, nor
 * do answers our own failure produced (5xx).
 */
export function countsTowardAllowance(
  metering: RuntimeMetering,
  status: number,
  errorCode: string | undefined,
  replayed: boolean,
): boolean {
  if (metering === "never" || status === 429 || status === 402 || status >= 500) return false;
  if (metering === "activation") return status === 201 && !replayed;
  return errorCode !== "LICENSE_REVOKED" && errorCode !== "LICENSE_EXPIRED";
}

const pathOf = (url: string): string => {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start === -1) return "/";
  const query = url.indexOf("?", start);
  return query === -1 ? url.slice(start) : url.slice(start, query);
};

const limiter = (name: string, setting: RateLimitSetting | null) =>
  setting ? new GcraLimiter({ name, ...setting }) : null;

const refused = (message: string, limiter: GcraLimiter, decision: RateLimitDecision) =>
  new ApiError(
    "RATE_LIMITED",
    message,
    {
      policy: limiter.policy.name,
      limit: limiter.policy.limit,
      window_sec: limiter.policy.windowSec,
      retry_after_sec: decision.retryAfterSec,
    },
    { headers: limiter.headers(decision) },
  );

/**
 * Runtime burst windows, the monthly Runtime allowance and the ended-plan refusal, before routing
 * (so a refused request costs no body read and is never recorded in runtime_events), and the
 * charging and counting that depend on the answer, after it. Constant work per request: a few
 * prefix checks, map lookups and, for device-proof calls, the activation's license from a cache.
 */
export function runtimeLimits(deps: RuntimeLimitDeps) {
  const byAddress = limiter("runtime-ip", deps.limits.ip);
  // Failed device proofs get their own per-address windows: devices behind one NAT address share
  // it, and their (proven) calls must not be refused because of the address's anonymous traffic.
  const failedProofs = limiter("runtime-ip-unproven", deps.limits.ip);
  const byActivation = limiter("runtime-activation", deps.limits.activation);
  const byLicense = limiter("runtime-license", deps.limits.license);

  return new Elysia({ name: "runtime-limits" })
    .onRequest(({ request, set }) => {
      const path = pathOf(request.url);
      const kind = classifyRuntimeRequest(request.method, path);
      if (kind === null) return;
      const now = deps.clock.now();
      deps.planGate.admit(request.method, path, now);
      const admission: RuntimeAdmission = { metering: kind.metering, at: now };
      if (kind.partition === "address") {
        admitByAddress(request, set.headers, now);
      } else {
        admission.device = admitDevice(request, set.headers, now);
      }
      if (kind.metering !== "never") deps.quota.check(now);
      const state = requestState.get(request);
      if (state) state.runtime = admission;
    })
    .mapResponse({ as: "global" }, ({ request, responseValue, set }) => {
      const state = requestState.get(request);
      const admission = state?.runtime;
      // Elysia also maps an error's response before the error handler has made one (undefined):
      // only the final answer decides.
      if (!state || !admission || responseValue === undefined) return;
      // Once only, whatever else maps this response.
      state.runtime = undefined;
      const status =
        responseValue instanceof Response
          ? responseValue.status
          : typeof set.status === "number"
            ? set.status
            : 200;
      const device = admission.device;
      if (device) {
        const nowMs = admission.at.getTime();
        if (state.errorCode !== undefined && UNPROVEN.has(state.errorCode)) {
          failedProofs?.charge(device.address, nowMs);
        } else {
          if (device.activationId !== null) byActivation?.charge(device.activationId, nowMs);
          if (device.licenseId !== null) byLicense?.charge(device.licenseId, nowMs);
        }
      }
      const replayed =
        responseValue instanceof Response && responseValue.headers.get("idempotent-replayed") === "true";
      if (countsTowardAllowance(admission.metering, status, state.errorCode, replayed)) {
        deps.quota.count(admission.at);
      }
    });

  function admitByAddress(request: Request, headers: Record<string, string | number>, now: Date): void {
    if (!byAddress) return;
    const address = addressPartition(clientAddress.of(request, deps.trustForwardedFor));
    const decision = byAddress.check(address, now.getTime());
    Object.assign(headers, byAddress.headers(decision));
    if (!decision.allowed) throw refused("Too many runtime requests from this address.", byAddress, decision);
  }

  /**
   * A device-proof call is let through while its activation's and license's windows have room,
   * and charged to them once its answer shows the proof verified (mapResponse above); a sender
   * whose proofs keep failing is refused per address.
   */
  function admitDevice(
    request: Request,
    headers: Record<string, string | number>,
    now: Date,
  ): RuntimeAdmission["device"] {
    const nowMs = now.getTime();
    const address = addressPartition(clientAddress.of(request, deps.trustForwardedFor));
    if (failedProofs) {
      const decision = failedProofs.peek(address, nowMs);
      if (!decision.allowed) {
        throw refused(
          "Too many requests with failing device proofs from this address.",
          failedProofs,
          decision,
        );
      }
    }
    const header = request.headers.get("x-service-activation");
    const activationId = header && header.length <= MAX_ACTIVATION_ID ? header : null;
    if (activationId === null) return { address, activationId: null, licenseId: null };
    const licenseId = byLicense ? deps.licenseOf(activationId) : null;
    let shown: { limiter: GcraLimiter; decision: RateLimitDecision } | null = null;
    for (const [bucket, key, message] of [
      [byActivation, activationId, "Too many requests for this activation."],
      [byLicense, licenseId, "Too many requests for this license."],
    ] as const) {
      if (!bucket || key === null) continue;
      const decision = bucket.peek(key, nowMs);
      if (!decision.allowed) throw refused(message, bucket, decision);
      // The window closest to refusing is the one a client needs to see.
      if (!shown || decision.remaining < shown.decision.remaining) shown = { limiter: bucket, decision };
    }
    if (shown) Object.assign(headers, shown.limiter.headers(shown.decision));
    return { address, activationId, licenseId };
  }
}
