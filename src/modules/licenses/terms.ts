import { canonicalize } from "../../crypto/jcs.ts";
import { parseDateTime } from "../../domain/datetime.ts";
import { checkEntitlementMap, checkEntitlementSize } from "../../domain/entitlements.ts";
import type { PlanDefinition } from "../../domain/plans.ts";
import { ApiError, type FieldErrorCollector } from "../../http/errors.ts";
import type { LicenseUpdateBody } from "./model.ts";
import type { LicenseRow } from "./service.ts";

/**
 * `expires_at` and `expiry` are one field (DESIGN §4): undefined when neither was sent, null for
 * "never", and a 422 when both were sent with different instants.
 */
export function sentExpiry(
  body: { expires_at?: string | null; expiry?: string | null },
  errors: FieldErrorCollector,
): Date | null | undefined {
  const parse = (field: string, value: string | null | undefined): Date | null | undefined => {
    if (value === undefined || value === null) return value;
    const date = parseDateTime(value);
    if (!date)
      errors.add(field, "must be an RFC 3339 date-time with a real calendar date, e.g. 2030-01-31T00:00:00Z");
    return date ?? undefined;
  };
  const a = parse("expires_at", body.expires_at);
  const b = parse("expiry", body.expiry);
  if (
    body.expires_at !== undefined &&
    body.expiry !== undefined &&
    (a?.getTime() ?? null) !== (b?.getTime() ?? null)
  ) {
    errors.add("expires_at", "expires_at and expiry are the same field and were sent with different values");
  }
  return body.expires_at !== undefined ? a : b;
}

/** A license's expiry lies in the future and within the plan's longest license. */
export function checkExpiry(expiresAt: Date | null, now: Date, plan: PlanDefinition): void {
  if (expiresAt === null) return;
  if (expiresAt.getTime() <= now.getTime())
    throw ApiError.validation({ expires_at: ["must be in the future"] });
  if (expiresAt.getTime() - now.getTime() > plan.license_duration_max_sec * 1000) {
    throw ApiError.validation({
      expires_at: [
        `is beyond the plan's license_duration_max_sec (${plan.license_duration_max_sec}s from now)`,
      ],
    });
  }
}

/** License entitlement overrides follow the policy's rules (names, at most 200), keyed by `field`. */
export function checkEntitlements(
  field: string,
  entitlements: Record<string, unknown> | undefined,
  errors: FieldErrorCollector,
): void {
  if (entitlements !== undefined)
    checkEntitlementMap(field, entitlements, (at, message) => errors.add(at, message));
}

/** Overrides merged into a license's own (convert-trial) count together against the same caps. */
export function checkMergedEntitlementSize(
  field: string,
  merged: Record<string, unknown>,
  errors: FieldErrorCollector,
): void {
  checkEntitlementSize(field, merged, (at, message) => errors.add(at, message));
}

/**
 * What an update really changes, compared by value (objects canonically), with the API names of the
 * changed fields for the audit trail. Sending a field's current value changes nothing.
 */
export function fieldChanges(current: LicenseRow, body: LicenseUpdateBody, expiry: Date | null | undefined) {
  const changes: Partial<LicenseRow> = {};
  const fields: string[] = [];
  const set = <K extends keyof LicenseRow>(field: string, column: K, value: LicenseRow[K] | undefined) => {
    if (value === undefined) return;
    const same =
      value instanceof Date || current[column] instanceof Date
        ? (value as Date | null)?.getTime() === (current[column] as Date | null)?.getTime()
        : canonicalize(value ?? null) === canonicalize(current[column] ?? null);
    if (same) return;
    changes[column] = value;
    fields.push(field);
  };
  set("expires_at", "expiresAt", expiry);
  set("renewal_authority", "renewalAuthority", body.renewal_authority);
  set("max_machines_override", "maxMachinesOverride", body.max_machines_override);
  set("max_concurrent_override", "maxConcurrentOverride", body.max_concurrent_override);
  set("license_unit_limit_override", "licenseUnitLimitOverride", body.license_unit_limit_override);
  set("entitlements", "entitlements", body.entitlements);
  set("metadata", "metadata", body.metadata);
  return { changes, fields };
}
