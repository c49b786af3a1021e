import { Elysia } from "elysia";
import type { Clock } from "../domain/clock.ts";
import type { ProofHooks } from "../modules/activations/gate.ts";
import { addressPartition, clientAddress } from "./client-address.ts";
import { ApiError } from "./errors.ts";
import {
  GcraLimiter,
  type RateLimitDecision,
  type RateLimitSetting,
  type RuntimeRateLimitSettings,
} from "./rate-limit.ts";
import { routedHook } from "./request-path.ts";
import { type RequestState, requestState } from "./request-state.ts";
import { classifyRuntimeRequest, type RuntimeMetering } from "./runtime-routes.ts";

/** What a runtime request that got through is charged and counted against once answered. */
export interface RuntimeAdmission {
  metering: RuntimeMetering;
  at: Date;
  /** Device-proof calls only: the windows the proof's outcome is charged to (ProofHooks). */
  device?: DeviceAdmission;
}

/**
 * Where a device-proof call's proof stands, for the windows: not checked yet (or refused before it
 * was: charged to the failing-proof windows when answered); refused because those windows were
 * full when it came to be checked (charged nothing); failed or verified (charged then).
 */
type ProofState = "unchecked" | "refused" | "failed" | "verified";

/** A device-proof call let through: the windows its proof's outcome is charged to. */
export interface DeviceAdmission extends ProofHooks {
  readonly address: string;
  /** The address-and-activation key of the failing-proof windows; null for an unknown activation. */
  readonly pair: string | null;
  readonly proof: ProofState;
}

export interface RuntimeLimitDeps {
  clock: Clock;
  limits: RuntimeRateLimitSettings;
  trustForwardedFor: boolean;
  /** 402 once the workspace plan has ended. */
  planGate: { admit(method: string, path: string, now: Date): void };
  /** The monthly Runtime allowance: checked and held at admission, settled once answered. */
  quota: { check(now: Date): void; hold(): void; settle(now: Date, counts: boolean): void };
  /** The license an activation belongs to (it never changes), or null for an unknown activation. */
  licenseOf(activationId: string): string | null;
}

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

type DeviceWindows = readonly (readonly [GcraLimiter | null, string | null, string])[];

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
  // Failing device proofs get windows of their own (admitDevice says how they are used): devices
  // behind one NAT address share it, and their (proven) calls must not be refused because of the
  // address's anonymous traffic.
  const failedProofs = limiter("runtime-ip-unproven", deps.limits.ip);
  const failedPairs = limiter("runtime-activation-unproven", deps.limits.activation);
  // Whether an activation failed from an address within the last window (one failure fills it).
  const failedLately = deps.limits.ip
    ? new GcraLimiter({ name: "runtime-ip-unproven", limit: 1, windowSec: deps.limits.ip.windowSec })
    : null;
  const byActivation = limiter("runtime-activation", deps.limits.activation);
  const byLicense = limiter("runtime-license", deps.limits.license);
  // Failures charged to the failing-proof windows so far. Only these charges fill them (time only
  // empties them), so a call admitted when the count stood where it still stands would be let in
  // again: its proof check asks them nothing more (one integer comparison on the heartbeat's path).
  let failures = 0;

  /**
   * A device-proof call let through (its ProofHooks), a class so that a request allocates no
   * closures. A batch that fails is run again (group-commit.ts), so each hook may be called twice.
   */
  class Admitted implements DeviceAdmission {
    proof: ProofState = "unchecked";

    constructor(
      readonly address: string,
      readonly pair: string | null,
      /** The activation's and license's windows with their keys and refusal messages. */
      private readonly windows: DeviceWindows,
      /** `failures` when it was admitted. */
      private readonly seen: number,
    ) {}

    /**
     * Calls admitted together passed the same look at the failing-proof windows; those whose
     * proofs failed since have been charged one by one, so the windows are asked again here,
     * before the activation is read or a signature checked.
     */
    checking(nowMs: number): void {
      if (this.proof === "failed" || this.proof === "verified" || this.seen === failures) return;
      this.proof = "refused";
      refuseFailingProofs(this.address, this.pair, nowMs);
      this.proof = "unchecked";
    }

    failed(nowMs: number): void {
      if (this.proof === "failed") return;
      this.proof = "failed";
      chargeFailure(this.address, this.pair, nowMs);
    }

    proven(nowMs: number): void {
      if (this.proof === "verified") return;
      this.proof = "verified";
      // Asked again: calls admitted together have been charged one by one since.
      deviceWindows(this.windows, nowMs);
      for (const [bucket, key] of this.windows) if (bucket && key !== null) bucket.charge(key, nowMs);
    }
  }

  return new Elysia({ name: "runtime-limits" })
    .onRequest(
      routedHook(({ request, set, path }) => {
        const kind = classifyRuntimeRequest(request.method, path);
        if (kind === null) return;
        const now = deps.clock.now();
        if (kind.planGated) deps.planGate.admit(request.method, path, now);
        const admission: RuntimeAdmission = { metering: kind.metering, at: now };
        if (kind.partition === "address") {
          admitByAddress(request, set.headers, now);
        } else {
          admission.device = admitDevice(request, set.headers, now);
        }
        const metered = kind.metering !== "never";
        if (metered) deps.quota.check(now);
        const state = requestState.get(request);
        if (state) {
          // Counted as used until answered (finish), so calls in flight together cannot pass the
          // allowance's ceiling.
          if (metered) deps.quota.hold();
          state.runtime = admission;
          state.finishUnrouted = finishUnrouted;
        }
      }),
    )
    .mapResponse({ as: "global" }, ({ request, responseValue, set }) => {
      const state = requestState.get(request);
      const admission = state?.runtime;
      // Elysia also maps an error's response before the error handler has made one (undefined):
      // only the final answer decides.
      if (!state || !admission || responseValue === undefined) return;
      const status =
        responseValue instanceof Response
          ? responseValue.status
          : typeof set.status === "number"
            ? set.status
            : 200;
      const replayed =
        responseValue instanceof Response && responseValue.headers.get("idempotent-replayed") === "true";
      finish(state, admission, countsTowardAllowance(admission.metering, status, state.errorCode, replayed));
    });

  /**
   * A path no route matches gets its 404 without mapResponse, and before any error hook of this
   * plugin runs: the conventions' error handler calls this (RequestState.finishUnrouted), so the
   * request's place in the allowance is given back, uncounted since no operation answered, and an
   * unchecked device call is charged. Without it each such request held a place until the process
   * ended. One function for every request: nothing is allocated per call.
   */
  function finishUnrouted(request: Request): void {
    const state = requestState.get(request);
    if (state?.runtime) finish(state, state.runtime, false);
  }

  /**
   * The answer is final, once per request: charges what a failing request costs and settles its
   * allowance place, counted as used when `counts` (countsTowardAllowance).
   */
  function finish(state: RequestState, admission: RuntimeAdmission, counts: boolean): void {
    state.runtime = undefined;
    // A request whose proof was never checked (malformed or missing headers, a body refused
    // before the proof, an unrouted path, our own failure) says nothing about who sent it: it goes
    // to the failing-proof windows of the sender's address, never to the activation it names.
    // One whose proof was checked was charged then (Admitted).
    const device = admission.device;
    if (device && device.proof === "unchecked") {
      chargeFailure(device.address, device.pair, admission.at.getTime());
    }
    if (admission.metering !== "never") deps.quota.settle(admission.at, counts);
  }

  function admitByAddress(request: Request, headers: Record<string, string | number>, now: Date): void {
    if (!byAddress) return;
    const address = addressPartition(clientAddress.of(request, deps.trustForwardedFor));
    const decision = byAddress.check(address, now.getTime());
    Object.assign(headers, byAddress.headers(decision));
    if (!decision.allowed)
      throw refused("Too many requests from this address; try again shortly.", byAddress, decision);
  }

  /**
   * A device-proof call is let through while its activation's and license's windows have room,
   * and charged to them once its proof verifies (Admitted.proven). Failing calls cost a signature
   * check each (or, for an unknown activation, a primary-key read), so they are limited too,
   * without letting a sender refuse devices that share its address:
   * - per address and activation named (`runtime-activation-unproven`): forging proofs in a
   *   device's name slows that device only from the forger's own address;
   * - per address (`runtime-ip-unproven`), all failures together. Past it, requests naming no
   *   known activation are refused, and a known activation is refused only if it failed from that
   *   address within the last window: one more signature check per known activation per window
   *   at most, while an activation that has not failed there (a genuine device) goes on.
   * Both are asked here and again as the proof is checked, and charged as it fails, one call at a
   * time (Admitted), so calls in flight together cannot overrun them.
   */
  function admitDevice(
    request: Request,
    headers: Record<string, string | number>,
    now: Date,
  ): DeviceAdmission {
    const nowMs = now.getTime();
    const address = addressPartition(clientAddress.of(request, deps.trustForwardedFor));
    const header = request.headers.get("x-service-activation");
    const activationId = header && header.length <= MAX_ACTIVATION_ID ? header : null;
    const licenseId =
      activationId !== null && (byLicense || failedProofs) ? deps.licenseOf(activationId) : null;
    // Only activations that exist get a key of their own, so made-up ids cannot fill the maps.
    const pair = licenseId !== null ? `${address} ${activationId}` : null;
    refuseFailingProofs(address, pair, nowMs);
    const windows = [
      [byActivation, activationId, "Too many requests for this activation."],
      [byLicense, licenseId, "Too many requests for this license."],
    ] as const;
    // Refused before the body is read while a window is already full; charged only on `proven`.
    const shown = deviceWindows(windows, nowMs);
    if (shown) Object.assign(headers, shown.limiter.headers(shown.decision));
    return new Admitted(address, pair, windows, failures);
  }

  /** Throws while the failing-proof windows refuse a call from `address` naming `pair` (admitDevice). */
  function refuseFailingProofs(address: string, pair: string | null, nowMs: number): void {
    if (
      failedProofs &&
      !failedProofs.allows(address, nowMs) &&
      (pair === null || !failedLately || !failedLately.allows(pair, nowMs))
    ) {
      const decision = failedProofs.peek(address, nowMs);
      const lately = pair !== null && failedLately ? failedLately.peek(pair, nowMs) : null;
      const retryAfterSec = Math.min(decision.retryAfterSec, lately?.retryAfterSec ?? Infinity);
      throw refused("Too many requests with failing device proofs from this address.", failedProofs, {
        ...decision,
        retryAfterSec,
      });
    }
    if (pair !== null && failedPairs && !failedPairs.allows(pair, nowMs)) {
      throw refused(
        "Too many requests with failing device proofs for this activation from this address.",
        failedPairs,
        failedPairs.peek(pair, nowMs),
      );
    }
  }

  function chargeFailure(address: string, pair: string | null, nowMs: number): void {
    failures++;
    failedProofs?.charge(address, nowMs);
    if (pair !== null) {
      failedPairs?.charge(pair, nowMs);
      failedLately?.charge(pair, nowMs);
    }
  }

  /** Throws for the first full window; else the one closest to refusing (what a client needs to see). */
  function deviceWindows(
    windows: DeviceWindows,
    nowMs: number,
  ): { limiter: GcraLimiter; decision: RateLimitDecision } | null {
    let shown: { limiter: GcraLimiter; decision: RateLimitDecision } | null = null;
    for (const [bucket, key, message] of windows) {
      if (!bucket || key === null) continue;
      const decision = bucket.peek(key, nowMs);
      if (!decision.allowed) throw refused(message, bucket, decision);
      if (!shown || decision.remaining < shown.decision.remaining) shown = { limiter: bucket, decision };
    }
    return shown;
  }
}
