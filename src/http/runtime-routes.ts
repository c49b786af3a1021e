/**
 * The one place that says how a Runtime API request is limited and metered (spec §4.1, §4.2 rules
 * 1, 10 and 12, §8; DESIGN §4 "Rate limits"). It looks at the method and path only, by pattern, so
 * a runtime route added later is covered the day it lands: anything under /runtime/ that is not a
 * device-proof route is limited per client address, and counts toward the monthly allowance
 * unless it is one of the verification calls. The served pages' own calls (the passkey pages'
 * under /passkeys/, and the buyer's claim page's redeem) are limited here too: unauthenticated,
 * each costs keystore HMACs and a store transaction, as a verification confirm does, so they
 * share its per-address window.
 */

/** Who a request's burst windows belong to. */
export type RuntimePartition =
  /** No credential before the body is read: per client address. */
  | "address"
  /** Device-proof calls: per activation (X-Service-Activation) and per license. */
  | "device";

/** Whether an answer counts toward the monthly Runtime allowance. */
export type RuntimeMetering =
  /** Every answer counts, except LICENSE_REVOKED and LICENSE_EXPIRED (rule 1, §8). */
  | "counts"
  /** Email verification start and confirm, trial verification start (rule 12). */
  | "never"
  /** Trial confirm: once, as the activation it creates (rule 10): a 201 that is not a replay. */
  | "activation";

export interface RuntimeRouteClass {
  partition: RuntimePartition;
  metering: RuntimeMetering;
  /**
   * Whether an ended plan refuses it (402 PLAN_ENDED, spec §4.1): Runtime operations only. The
   * passkey pages are neither Runtime nor Management API.
   */
  planGated: boolean;
}

export const RUNTIME_PREFIX = "/runtime/";
const V1 = "/runtime/v1/";
export const PASSKEYS_PREFIX = "/passkeys/";
/** The billing claim page's one call; the page itself (GET) is static. */
const CLAIM_REDEEM_PATH = "/billing/v1/claims/redeem";

const ADDRESS_COUNTS: RuntimeRouteClass = { partition: "address", metering: "counts", planGated: true };
const ADDRESS_NEVER: RuntimeRouteClass = { partition: "address", metering: "never", planGated: true };
const ADDRESS_ACTIVATION: RuntimeRouteClass = {
  partition: "address",
  metering: "activation",
  planGated: true,
};
const DEVICE_COUNTS: RuntimeRouteClass = { partition: "device", metering: "counts", planGated: true };
/** The served pages' JSON calls: the per-address window, never metered, never 402. */
const PAGE_CALL: RuntimeRouteClass = { partition: "address", metering: "never", planGated: false };

/**
 * The class of a runtime request, or null when it is not one the limits apply to: outside
 * /runtime/ (except a served page's POST), or an OPTIONS request (a CORS preflight is never
 * limited or counted, §8). Constant time: a few prefix checks on the path, no allocation on the
 * hot path.
 */
export function classifyRuntimeRequest(method: string, path: string): RuntimeRouteClass | null {
  // The pages themselves (GET) are static and cost nothing to serve.
  if (path.startsWith(PASSKEYS_PREFIX)) return method === "POST" ? PAGE_CALL : null;
  // The router serves it with one trailing slash too (as below for runtime routes).
  if (path === CLAIM_REDEEM_PATH || path === `${CLAIM_REDEEM_PATH}/`)
    return method === "POST" ? PAGE_CALL : null;
  if (!path.startsWith(RUNTIME_PREFIX) || method === "OPTIONS") return null;
  if (!path.startsWith(V1)) return ADDRESS_COUNTS;
  // The router serves a path with one trailing slash as the same route, so it is the same class.
  const rest = path.slice(V1.length, path.endsWith("/") ? -1 : undefined);
  // activations/{id}[/heartbeat|/sealed-file-keys]: device proof; bare `activations` is create.
  if (rest.startsWith("activations/")) return DEVICE_COUNTS;
  if (rest === "leases" || rest.startsWith("leases/")) return DEVICE_COUNTS;
  if (rest === "email-verifications" || rest.startsWith("email-verifications/")) return ADDRESS_NEVER;
  if (rest === "trial-verifications") return ADDRESS_NEVER;
  if (rest.startsWith("trial-verifications/")) {
    return rest.endsWith("/confirm") ? ADDRESS_ACTIVATION : ADDRESS_NEVER;
  }
  // activations (create), time, products/{id}/trust-bundle, and any runtime route still to come.
  return ADDRESS_COUNTS;
}
