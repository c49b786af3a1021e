import type { ErrorCode } from "../http/errors.ts";
import { type LicenseFacts, licenseStatus } from "./license-state.ts";

export type RuntimeOperation =
  | "activate"
  | "heartbeat"
  | "deactivate"
  | "lease"
  | "sealed_file_key"
  | "offline_package";

export interface RuntimeFacts {
  license: LicenseFacts & { blocked: boolean };
  activation?: { status: "active" | "deactivated"; deviceBlocked: boolean };
}

type Guard = (facts: RuntimeFacts, now: Date, op: RuntimeOperation) => ErrorCode | false;

/**
 * What decides whether a runtime call may proceed, in precedence order. The first guard that
 * fires names the denial. License state comes before activation state (spec §3.2 rule 1), so a
 * revoked license's device hears LICENSE_REVOKED even if it was deactivated too.
 */
const GUARDS: Guard[] = [
  // License state: a vendor's decision first, then the calendar.
  (f, now) => licenseStatus(f.license, now) === "revoked" && "LICENSE_REVOKED",
  (f, now) => licenseStatus(f.license, now) === "expired" && "LICENSE_EXPIRED",
  // The vendor's device-risk policy: the license, then this device.
  (f) => f.license.blocked && "LICENSE_BLOCKED",
  (f) => f.activation?.deviceBlocked === true && "DEVICE_BLOCKED",
  // Activation state after license state.
  (f) => f.activation?.status === "deactivated" && "ACTIVATION_DEACTIVATED",
  // Suspension is a state a heartbeat reports; it refuses everything that grants new use.
  (f, now, op) => op !== "heartbeat" && licenseStatus(f.license, now) === "suspended" && "LICENSE_SUSPENDED",
];

/** Freeing a slot is allowed whatever the license's state; only a deactivated activation is gone. */
const DEACTIVATE_GUARDS: Guard[] = [
  (f) => f.activation?.status === "deactivated" && "ACTIVATION_DEACTIVATED",
];

/** The denial for this call, or null when it may proceed. Pure: same facts and time, same answer. */
export function runtimeDenial(op: RuntimeOperation, facts: RuntimeFacts, now: Date): ErrorCode | null {
  for (const guard of op === "deactivate" ? DEACTIVATE_GUARDS : GUARDS) {
    const code = guard(facts, now, op);
    if (code) return code;
  }
  return null;
}

/** Denials a device must be able to trust: signed like a success (DESIGN §5). */
export const SIGNED_DENIALS: ReadonlySet<ErrorCode> = new Set([
  "LICENSE_REVOKED",
  "LICENSE_EXPIRED",
  "LICENSE_SUSPENDED",
  "ACTIVATION_DEACTIVATED",
  // A named-user device whose assignment ended (spec §4.2 rules 1 and 3; RuntimeGate.denyUnassigned).
  "NAMED_USER_ASSIGNMENT_UNAVAILABLE",
]);
