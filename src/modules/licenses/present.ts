import { licenseStatus } from "../../domain/license-state.ts";
import type { PolicySettings } from "../../domain/policy-rules.ts";
import type { LicenseRow } from "./service.ts";

/** The full license object (documented in docs/api.md). Effective limits fold in the policy. */
export function presentLicense(row: LicenseRow, policy: PolicySettings, key: string, now: Date) {
  return {
    public_id: row.id,
    environment: row.environment,
    product_id: row.productId,
    policy_id: row.policyId,
    customer_id: row.customerId,
    key,
    license_type: row.licenseType as PolicySettings["license_type"],
    status: licenseStatus(row, now),
    status_reason: row.statusReason,
    expires_at: row.expiresAt?.toISOString() ?? null,
    renewal_authority: row.renewalAuthority as PolicySettings["renewal_authority"],
    max_machines: row.maxMachinesOverride ?? policy.max_machines,
    max_concurrent: row.maxConcurrentOverride ?? policy.max_concurrent,
    license_unit_limit: row.licenseUnitLimitOverride ?? policy.license_unit_limit,
    max_machines_override: row.maxMachinesOverride,
    max_concurrent_override: row.maxConcurrentOverride,
    license_unit_limit_override: row.licenseUnitLimitOverride,
    entitlements: { ...policy.entitlements, ...row.entitlements },
    entitlement_overrides: row.entitlements,
    metadata: row.metadata,
    version: row.version,
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
    suspended_at: row.suspendedAt?.toISOString() ?? null,
    revoked_at: row.revokedAt?.toISOString() ?? null,
    converted_at: row.convertedAt?.toISOString() ?? null,
  };
}
