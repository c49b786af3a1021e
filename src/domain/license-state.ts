import type { PolicySettings } from "./policy-rules.ts";

export type StoredLicenseStatus = "active" | "suspended" | "revoked";
export type LicenseStatus = StoredLicenseStatus | "expired";

export interface LicenseFacts {
  status: StoredLicenseStatus;
  expiresAt: Date | null;
}

/**
 * The license's state at `now`, in precedence order: an explicit vendor decision (revoked, then
 * suspended) outranks the calendar (expired). `expired` is never stored, so it cannot go stale.
 */
export function licenseStatus(license: LicenseFacts, now: Date): LicenseStatus {
  if (license.status === "revoked") return "revoked"; // terminal: nothing brings a revoked license back
  if (license.status === "suspended") return "suspended"; // vendor hold outranks the calendar
  if (license.expiresAt !== null && license.expiresAt.getTime() <= now.getTime()) return "expired";
  return "active";
}

/** Adds calendar months in UTC, clamping to the month's last day (Jan 31 + 1 month = Feb 28/29). */
export function addMonths(from: Date, months: number): Date {
  const result = new Date(from.getTime());
  const day = result.getUTCDate();
  result.setUTCDate(1);
  result.setUTCMonth(result.getUTCMonth() + months);
  const lastDay = new Date(Date.UTC(result.getUTCFullYear(), result.getUTCMonth() + 1, 0)).getUTCDate();
  result.setUTCDate(Math.min(day, lastDay));
  return result;
}

const CYCLE_MONTHS = { monthly: 1, quarterly: 3, yearly: 12 } as const;

/**
 * Expiry when the vendor gives none: trials run `trial_days`, subscriptions one billing cycle
 * (a year when the cycle is `none`), perpetual licenses never expire.
 */
export function defaultExpiry(
  policy: Pick<PolicySettings, "license_type" | "billing_cycle" | "trial_days">,
  now: Date,
): Date | null {
  switch (policy.license_type) {
    case "perpetual":
      return null;
    case "trial":
      return new Date(now.getTime() + policy.trial_days * 86_400_000);
    case "subscription":
      return addMonths(now, policy.billing_cycle === "none" ? 12 : CYCLE_MONTHS[policy.billing_cycle]);
  }
}
