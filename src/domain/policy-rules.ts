import { addFieldError, type FieldErrors, newFieldErrors } from "../http/errors.ts";
import { checkEntitlementMap } from "./entitlements.ts";
import { PLANS, type PlanDefinition } from "./plans.ts";

/** The allowed values of every policy enum. Documented in docs/api.md; clients may rely on them. */
export const LICENSE_TYPES = ["perpetual", "subscription", "trial"] as const;
export const VALIDATION_MODES = ["online", "hybrid", "offline"] as const;
export const FAIL_MODES = ["open", "closed"] as const;
export const IDENTITY_MODES = ["device", "named_user"] as const;
export const PERPETUAL_MODES = ["managed", "unmanaged"] as const;
export const CONCURRENCY_UNITS = ["device", "instance"] as const;
export const FINGERPRINT_PROFILES = ["standard", "strict", "relaxed"] as const;
export const RENEWAL_AUTHORITIES = ["vendor", "external_billing"] as const;
export const BILLING_CYCLES = ["none", "monthly", "quarterly", "yearly"] as const;

export type LicenseType = (typeof LICENSE_TYPES)[number];

export interface PolicySettings {
  license_type: LicenseType;
  validation_mode: (typeof VALIDATION_MODES)[number];
  fail_mode: (typeof FAIL_MODES)[number];
  identity_mode: (typeof IDENTITY_MODES)[number];
  perpetual_mode: (typeof PERPETUAL_MODES)[number];
  concurrency_unit: (typeof CONCURRENCY_UNITS)[number];
  fingerprint_profile: (typeof FINGERPRINT_PROFILES)[number];
  renewal_authority: (typeof RENEWAL_AUTHORITIES)[number];
  billing_cycle: (typeof BILLING_CYCLES)[number];
  heartbeat_required: boolean;
  max_machines: number;
  max_concurrent: number | null;
  license_unit_limit: number | null;
  cert_ttl_sec: number;
  heartbeat_sec: number;
  lease_ttl_sec: number;
  lease_heartbeat_sec: number;
  network_grace_sec: number;
  trial_days: number;
  entitlements: Record<string, unknown>;
}

/** What a fingerprint profile means, as returned in policy responses. */
export const FINGERPRINT_PROFILE_DETAILS = {
  standard: {
    name: "standard",
    on_machine_change: "require_full_machine_info",
    baseline_max_age_sec: 86_400,
  },
  strict: { name: "strict", on_machine_change: "require_full_machine_info", baseline_max_age_sec: 3_600 },
  relaxed: { name: "relaxed", on_machine_change: "accept", baseline_max_age_sec: 86_400 },
} as const;

const DAY = 86_400;

/**
 * A policy from a name alone: the plan's `policy_defaults` first, then what suits the kind. The
 * result always satisfies the plan's constraints.
 */
export function policyDefaults(licenseType: LicenseType, plan: PlanDefinition): PolicySettings {
  const c = plan.policy_constraints;
  return {
    license_type: licenseType,
    validation_mode: "online",
    fail_mode: "open",
    identity_mode: "device",
    perpetual_mode: "managed",
    concurrency_unit: "device",
    fingerprint_profile: "standard",
    renewal_authority: "vendor",
    billing_cycle: licenseType === "subscription" ? "yearly" : "none",
    heartbeat_required: licenseType !== "perpetual",
    max_machines: 1,
    max_concurrent: null,
    license_unit_limit: null,
    cert_ttl_sec: plan.policy_defaults.cert_ttl_sec,
    heartbeat_sec: Math.max(plan.policy_defaults.heartbeat_sec, c.activation_sync_min_sec),
    lease_ttl_sec: Math.max(900, c.floating_lease_ttl_min_sec),
    lease_heartbeat_sec: Math.max(300, c.floating_sync_min_sec),
    network_grace_sec: plan.policy_defaults.network_grace_sec,
    trial_days: licenseType === "trial" ? 14 : 0,
    entitlements: {},
  };
}

/**
 * The longest a revoked license can keep working on a device that stays offline: its last
 * certificate, plus the network grace when the policy fails open.
 */
export const revocationExposureSec = (p: PolicySettings): number =>
  p.cert_ttl_sec + (p.fail_mode === "open" ? p.network_grace_sec : 0);

/** The most machines, floating seats or named users one license can have (policy or license override). */
export const MAX_LICENSE_COUNT = 1_000_000;

const loosest = (pick: (plan: PlanDefinition) => number, direction: "min" | "max"): number =>
  Math[direction](...Object.values(PLANS).map(pick));

/**
 * The range each numeric setting has on every plan: fixed bounds, and where a plan sets one (its
 * policy_constraints), the loosest plan's. The request schemas (and so /openapi.json) state these;
 * policyViolations then holds a policy to its workspace plan's own, possibly narrower, bounds.
 */
export const POLICY_NUMBER_BOUNDS = {
  max_machines: { min: 1, max: MAX_LICENSE_COUNT },
  max_concurrent: { min: 1, max: MAX_LICENSE_COUNT },
  license_unit_limit: { min: 1, max: MAX_LICENSE_COUNT },
  cert_ttl_sec: { min: 300, max: loosest((p) => p.policy_constraints.cert_ttl_max_sec, "max") },
  heartbeat_sec: { min: loosest((p) => p.policy_constraints.activation_sync_min_sec, "min"), max: 30 * DAY },
  lease_ttl_sec: {
    min: loosest((p) => p.policy_constraints.floating_lease_ttl_min_sec, "min"),
    max: 7 * DAY,
  },
  lease_heartbeat_sec: {
    min: loosest((p) => p.policy_constraints.floating_sync_min_sec, "min"),
    max: 7 * DAY,
  },
  network_grace_sec: { min: 0, max: 90 * DAY },
  trial_days: { min: 0, max: 365 },
} as const satisfies Partial<Record<keyof PolicySettings, { min: number; max: number }>>;

/** Every rule a policy's numbers must keep, against the plan's constraints. Empty when valid. */
/**
 * `storedEntitlements`: the entitlements are the policy's stored ones, not sent in this change. A
 * map stored before its size cap keeps standing (an unrelated change must not fail over it); its
 * names and values are still checked, since those rules are as old as the map.
 */
export function policyViolations(
  p: PolicySettings,
  plan: PlanDefinition,
  options: { storedEntitlements?: boolean } = {},
): FieldErrors {
  const c = plan.policy_constraints;
  const errors = newFieldErrors();
  const add = (field: string, message: string) => addFieldError(errors, field, message);
  const range = (field: keyof PolicySettings, value: number | null, min: number, max: number, why = "") => {
    if (value === null) return;
    if (value < min || value > max) add(field, `must be between ${min} and ${max}${why}`);
  };

  const b = POLICY_NUMBER_BOUNDS;
  range("max_machines", p.max_machines, b.max_machines.min, b.max_machines.max);
  range("max_concurrent", p.max_concurrent, b.max_concurrent.min, b.max_concurrent.max);
  range("license_unit_limit", p.license_unit_limit, b.license_unit_limit.min, b.license_unit_limit.max);
  range("cert_ttl_sec", p.cert_ttl_sec, b.cert_ttl_sec.min, c.cert_ttl_max_sec, " (plan cert_ttl_max_sec)");
  range(
    "heartbeat_sec",
    p.heartbeat_sec,
    c.activation_sync_min_sec,
    b.heartbeat_sec.max,
    " (plan activation_sync_min_sec)",
  );
  range(
    "lease_ttl_sec",
    p.lease_ttl_sec,
    c.floating_lease_ttl_min_sec,
    b.lease_ttl_sec.max,
    " (plan floating_lease_ttl_min_sec)",
  );
  range(
    "lease_heartbeat_sec",
    p.lease_heartbeat_sec,
    c.floating_sync_min_sec,
    b.lease_heartbeat_sec.max,
    " (plan floating_sync_min_sec)",
  );
  range("network_grace_sec", p.network_grace_sec, b.network_grace_sec.min, b.network_grace_sec.max);
  range("trial_days", p.trial_days, p.license_type === "trial" ? 1 : b.trial_days.min, b.trial_days.max);

  if (p.heartbeat_sec > p.cert_ttl_sec)
    add("heartbeat_sec", "must not exceed cert_ttl_sec, or certificates lapse between heartbeats");
  if (p.lease_heartbeat_sec >= p.lease_ttl_sec)
    add("lease_heartbeat_sec", "must be shorter than lease_ttl_sec");
  const exposure = revocationExposureSec(p);
  if (exposure > c.revocation_exposure_max_sec) {
    const message = `cert_ttl_sec${p.fail_mode === "open" ? " + network_grace_sec" : ""} (${exposure}s) exceeds the plan's revocation_exposure_max_sec (${c.revocation_exposure_max_sec}s)`;
    add("cert_ttl_sec", message);
    if (p.fail_mode === "open") add("network_grace_sec", message);
  }
  if (p.perpetual_mode === "unmanaged" && p.license_type !== "perpetual") {
    add("perpetual_mode", "unmanaged is only for perpetual licenses");
  }
  // A named user activates online with an emailed token, and offline packages are refused to
  // named-user licenses (src/modules/offline): an offline-only one could never be used at all.
  if (
    p.identity_mode === "named_user" &&
    (p.validation_mode === "offline" || p.perpetual_mode === "unmanaged")
  )
    add(
      "identity_mode",
      "named_user needs online activation; use validation_mode online or hybrid, and a managed perpetual_mode",
    );
  if (p.license_type === "trial" && p.billing_cycle !== "none")
    add("billing_cycle", "trials are not billed; use none");
  if (p.license_type === "perpetual" && p.billing_cycle !== "none")
    add("billing_cycle", "perpetual licenses are not billed periodically; use none");

  checkEntitlementMap("entitlements", p.entitlements, add, { size: !options.storedEntitlements });
  return errors;
}
