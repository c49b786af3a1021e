import type { Deps } from "../../deps.ts";
import { nextMonthStart } from "../../domain/months.ts";
import { FEATURES, minimumPlanFor, PLANS } from "../../domain/plans.ts";
import { unrevokedLicenses } from "../licenses/tallies.ts";
import { countEndpoints } from "../webhooks/enqueue.ts";
import type { PlanTerms } from "../workspace/service.ts";
import { MANAGEMENT_REQUESTS, RUNTIME_REQUESTS } from "./quota.ts";
import type { UsageMeter } from "./usage-meter.ts";

/** The plan report: limits from the plan, usage from the store and the request meter. */
export class PlanReportService {
  constructor(
    private readonly deps: Pick<Deps, "db" | "sqlite" | "clock">,
    /** Read afresh: the report is where a vendor checks a plan change took effect. */
    private readonly terms: () => PlanTerms,
    private readonly meter: UsageMeter,
  ) {}

  report() {
    const { plan, trial, endsAt } = this.terms();
    const now = this.deps.clock.now();
    const used: Record<string, number> = {
      licenses: this.countLicenses(),
      trial_licenses: this.countLicenses("trial"),
      webhook_endpoints: countEndpoints(this.deps.sqlite),
      [MANAGEMENT_REQUESTS]: this.meter.used(MANAGEMENT_REQUESTS, now),
      [RUNTIME_REQUESTS]: this.meter.used(RUNTIME_REQUESTS, now),
    };
    const monthly = nextMonthStart(now).toISOString();
    const quotas = Object.fromEntries(
      Object.entries(plan.quotas)
        .filter(([key]) => used[key] !== undefined)
        .map(([key, quota]) => {
          const usedNow = used[key] ?? 0;
          return [
            key,
            {
              limit: quota.limit,
              used: usedNow,
              remaining: Math.max(0, quota.limit - usedNow),
              limit_with_overage: quota.limit + quota.overage,
              resets_at: quota.period === "month" ? monthly : null,
            },
          ];
        }),
    );
    return {
      plan: {
        code: plan.code,
        name: plan.name,
        trial: trial || plan.trial,
        ends_at: endsAt?.toISOString() ?? null,
      },
      quotas,
      policy_constraints: plan.policy_constraints,
      policy_defaults: plan.policy_defaults,
      revocation_exposure_max_sec_by_plan: Object.fromEntries(
        Object.values(PLANS).map((p) => [p.code, p.policy_constraints.revocation_exposure_max_sec]),
      ),
      license_duration_max_sec: plan.license_duration_max_sec,
      unavailable_features: FEATURES.filter((f) => !plan.features.includes(f)).map((key) => {
        const minimum = minimumPlanFor(key);
        return { key, minimum_plan: minimum.code, minimum_plan_name: minimum.name };
      }),
    };
  }

  private countLicenses(licenseType?: string): number {
    // Live licenses only, as the quota counts them: test licenses are free.
    return unrevokedLicenses(this.deps.db, "live", licenseType);
  }
}
