/**
 * The workspace plan catalogue. A self-hosted install runs `self_hosted` (everything on) unless the
 * operator picks another with `licensing plan set`; the smaller plans exist so that every
 * entitlement and quota check can be exercised.
 */
export const FEATURES = [
  "email_license_verification",
  "offline_packages",
  "webhooks",
  "trial_licenses",
  "sealed_files",
  "browser_runtime",
  "billing_integration",
] as const;
export type Feature = (typeof FEATURES)[number];

export interface PolicyConstraints {
  /** Smallest heartbeat interval a policy may ask for. */
  activation_sync_min_sec: number;
  /** Longest a revoked license may keep working on a device (see revocationExposureSec). */
  revocation_exposure_max_sec: number;
  cert_ttl_max_sec: number;
  /** Smallest lease heartbeat interval. */
  floating_sync_min_sec: number;
  floating_lease_ttl_min_sec: number;
}

export interface PolicyDefaults {
  heartbeat_sec: number;
  cert_ttl_sec: number;
  network_grace_sec: number;
}

export interface QuotaDefinition {
  limit: number;
  /** Allowed beyond `limit` before requests are refused (0 = hard limit). */
  overage: number;
  period: "month" | "none";
}

export interface PlanDefinition {
  code: string;
  name: string;
  rank: number;
  trial: boolean;
  features: readonly Feature[];
  quotas: Record<string, QuotaDefinition>;
  policy_constraints: PolicyConstraints;
  policy_defaults: PolicyDefaults;
  license_duration_max_sec: number;
}

const DAY = 86_400;

const STANDARD_DEFAULTS: PolicyDefaults = {
  heartbeat_sec: 3_600,
  cert_ttl_sec: 7 * DAY,
  network_grace_sec: 3 * DAY,
};

const plan = (
  code: string,
  name: string,
  rank: number,
  features: readonly Feature[],
  quotas: Record<string, number>,
  constraints: PolicyConstraints,
  licenseDurationMaxSec: number,
): PlanDefinition => ({
  code,
  name,
  rank,
  trial: false,
  features,
  quotas: Object.fromEntries(
    Object.entries(quotas).map(([key, limit]) => [
      key,
      {
        limit,
        overage: key.endsWith("_requests") ? Math.floor(limit / 10) : 0,
        period: key.endsWith("_requests") ? "month" : "none",
      },
    ]),
  ),
  policy_constraints: constraints,
  policy_defaults: STANDARD_DEFAULTS,
  license_duration_max_sec: licenseDurationMaxSec,
});

export const PLANS: Record<string, PlanDefinition> = {
  free: plan(
    "free",
    "Free",
    0,
    ["offline_packages"],
    {
      management_requests: 10_000,
      runtime_requests: 100_000,
      licenses: 100,
      trial_licenses: 0,
      webhook_endpoints: 0,
    },
    {
      activation_sync_min_sec: 3_600,
      revocation_exposure_max_sec: 14 * DAY,
      cert_ttl_max_sec: 14 * DAY,
      floating_sync_min_sec: 300,
      floating_lease_ttl_min_sec: 900,
    },
    366 * DAY,
  ),
  personal: plan(
    "personal",
    "Personal",
    1,
    ["email_license_verification", "offline_packages", "webhooks"],
    {
      management_requests: 100_000,
      runtime_requests: 1_000_000,
      licenses: 1_000,
      trial_licenses: 0,
      webhook_endpoints: 10,
    },
    {
      activation_sync_min_sec: 900,
      revocation_exposure_max_sec: 30 * DAY,
      cert_ttl_max_sec: 30 * DAY,
      floating_sync_min_sec: 120,
      floating_lease_ttl_min_sec: 300,
    },
    3 * 366 * DAY,
  ),
  business: plan(
    "business",
    "Business",
    2,
    FEATURES,
    {
      management_requests: 1_000_000,
      runtime_requests: 20_000_000,
      licenses: 50_000,
      trial_licenses: 5_000,
      webhook_endpoints: 50,
    },
    {
      activation_sync_min_sec: 300,
      revocation_exposure_max_sec: 90 * DAY,
      cert_ttl_max_sec: 90 * DAY,
      floating_sync_min_sec: 30,
      floating_lease_ttl_min_sec: 60,
    },
    10 * 366 * DAY,
  ),
  self_hosted: plan(
    "self_hosted",
    "Self-hosted",
    3,
    FEATURES,
    {
      management_requests: 1_000_000_000,
      runtime_requests: 1_000_000_000,
      licenses: 10_000_000,
      trial_licenses: 1_000_000,
      // Every event is written once per endpoint inside the request that caused it: thousands of
      // endpoints made each write (a device's activation too) hold the thread for 100s of ms.
      webhook_endpoints: 100,
    },
    {
      activation_sync_min_sec: 60,
      revocation_exposure_max_sec: 365 * DAY,
      cert_ttl_max_sec: 365 * DAY,
      floating_sync_min_sec: 10,
      floating_lease_ttl_min_sec: 30,
    },
    100 * 366 * DAY,
  ),
};

export const DEFAULT_PLAN_CODE = "self_hosted";

export function planByCode(code: string): PlanDefinition | undefined {
  return Object.hasOwn(PLANS, code) ? PLANS[code] : undefined;
}

/** The workspace's plan from its stored code: the default for none, or for a code no longer known. */
export const storedPlan = (code: string | null | undefined): PlanDefinition =>
  planByCode(code ?? DEFAULT_PLAN_CODE) ?? (PLANS[DEFAULT_PLAN_CODE] as PlanDefinition);

export const hasFeature = (plan: PlanDefinition, feature: Feature): boolean =>
  plan.features.includes(feature);

/** The cheapest plan that has `feature`, for `unavailable_features`. */
export function minimumPlanFor(feature: Feature): PlanDefinition {
  const candidates = Object.values(PLANS)
    .filter((p) => p.features.includes(feature))
    .sort((a, b) => a.rank - b.rank);
  const cheapest = candidates[0];
  if (!cheapest) throw new Error(`no plan offers ${feature}`);
  return cheapest;
}
