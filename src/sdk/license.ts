/**
 * Offline license state from the cached, verified certificate (no network use).
 *
 * - "clock_tampered": the local clock is more than 300 s behind the highest verified server_time.
 * - "invalid": not activated, an authentic denial was received (revoked, expired, suspended,
 *   deactivated), no usable certificate, the certificate's license status is revoked, expired or
 *   suspended (or the last heartbeat said suspended), or both `exp` and any grace have passed.
 * - "valid": now < exp.
 * - "grace": exp <= now < exp + heartbeat.grace_sec, when grace_sec > 0 and the license itself
 *   has not expired (license.expires_at null or now < license.expires_at).
 */
import type { CertificateClaims, VerifiedCertificate } from "./certificate.ts";
import type { StoredActivation, StoredDenial, StoredHeartbeat } from "./state.ts";

export type LicenseState = "valid" | "grace" | "invalid" | "clock_tampered";

export type LicenseReason =
  | "ok"
  | "grace"
  | "clock_tampered"
  | "not_activated"
  | "no_certificate"
  | "certificate_invalid"
  | "revoked"
  | "license_expired"
  | "suspended"
  | "deactivated"
  | "unassigned"
  | "expired";

export interface LicenseInfo {
  state: LicenseState;
  reason: LicenseReason;
  /** Local time used for the decision (unix seconds). */
  now: number;
  /** Highest verified server_time seen on this device (unix seconds). */
  serverTimeHighWater?: number;
  activationId?: string;
  licenseId?: string;
  /** Certificate `exp` (unix seconds). */
  expiresAt?: number;
  /** exp + grace_sec, when the policy grants grace. */
  graceEndsAt?: number;
  claims?: CertificateClaims;
  /** The license's entitlements map (from the certificate). */
  entitlements: Record<string, unknown>;
}

/** How far (seconds) the local clock may sit behind the verified server time. */
export const CLOCK_TAMPER_TOLERANCE_SEC = 300;

export interface LicenseInputs {
  nowSec: number;
  /** Highest verified server_time. */
  highWater: number | undefined;
  /** Highest local clock reading since the last verified server time (catches offline set-backs). */
  localHighWater?: number | undefined;
  activation: StoredActivation | undefined;
  denial: StoredDenial | undefined;
  certificate: VerifiedCertificate | "invalid" | undefined;
  lastHeartbeat: StoredHeartbeat | undefined;
}

const DENIAL_REASON: Record<string, LicenseReason> = {
  LICENSE_REVOKED: "revoked",
  LICENSE_EXPIRED: "license_expired",
  LICENSE_SUSPENDED: "suspended",
  ACTIVATION_DEACTIVATED: "deactivated",
  NAMED_USER_ASSIGNMENT_UNAVAILABLE: "unassigned",
};

const STATUS_REASON: Record<string, LicenseReason> = {
  revoked: "revoked",
  expired: "license_expired",
  suspended: "suspended",
};

export function evaluateLicense(input: LicenseInputs): LicenseInfo {
  const { nowSec, highWater, localHighWater, activation, denial } = input;
  const base = {
    now: nowSec,
    entitlements: {},
    ...(highWater === undefined ? {} : { serverTimeHighWater: highWater }),
  };
  const latestSeen = Math.max(
    highWater ?? Number.NEGATIVE_INFINITY,
    localHighWater ?? Number.NEGATIVE_INFINITY,
  );
  if (nowSec < latestSeen - CLOCK_TAMPER_TOLERANCE_SEC) {
    return { ...base, state: "clock_tampered", reason: "clock_tampered" };
  }
  const denialReason = denial ? DENIAL_REASON[denial.code] : undefined;
  if (!activation) {
    const reason = denialReason === "deactivated" ? "deactivated" : "not_activated";
    return { ...base, state: "invalid", reason };
  }
  const ids = { activationId: activation.activation_id, licenseId: activation.license_id };
  if (denialReason && denial?.activation_id === activation.activation_id) {
    return { ...base, ...ids, state: "invalid", reason: denialReason };
  }
  const cert = input.certificate;
  if (cert === undefined) return { ...base, ...ids, state: "invalid", reason: "no_certificate" };
  if (cert === "invalid") return { ...base, ...ids, state: "invalid", reason: "certificate_invalid" };

  const c = cert.claims;
  const grace = c.heartbeat.grace_sec;
  const info = {
    ...base,
    ...ids,
    claims: c,
    entitlements: c.license.entitlements,
    expiresAt: c.exp,
    ...(grace > 0 ? { graceEndsAt: c.exp + grace } : {}),
  };
  const statusReason = STATUS_REASON[c.license.status];
  if (statusReason) return { ...info, state: "invalid", reason: statusReason };
  if (input.lastHeartbeat?.license_status === "suspended")
    return { ...info, state: "invalid", reason: "suspended" };
  // Signed by a key retired since, whose place in the bundle has run out (protocol §4).
  if (cert.signerRetiredUntil !== undefined && nowSec >= cert.signerRetiredUntil)
    return { ...info, state: "invalid", reason: "certificate_invalid" };
  if (nowSec < c.exp) return { ...info, state: "valid", reason: "ok" };
  const licenseOver = c.license.expires_at !== null && nowSec >= c.license.expires_at;
  if (grace > 0 && nowSec < c.exp + grace && !licenseOver)
    return { ...info, state: "grace", reason: "grace" };
  return { ...info, state: "invalid", reason: licenseOver ? "license_expired" : "expired" };
}
