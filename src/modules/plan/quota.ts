import { nextMonthStart } from "../../domain/months.ts";
import type { PlanDefinition } from "../../domain/plans.ts";
import { ApiError } from "../../http/errors.ts";
import { isPlanReport } from "./plan-route.ts";
import type { UsageMeter } from "./usage-meter.ts";

export const MANAGEMENT_REQUESTS = "management_requests";
export const RUNTIME_REQUESTS = "runtime_requests";

/**
 * A monthly allowance of the plan (`limit` plus `overage`, spec §2.4 `limit_with_overage`),
 * counted by the batched meter: deciding and counting cost no store write per request.
 */
class MonthlyAllowance {
  constructor(
    private readonly metric: string,
    private readonly what: string,
    private readonly meter: UsageMeter,
    private readonly plan: () => PlanDefinition,
  ) {}

  /** Throws 429 RATE_LIMITED once the month's allowance, overage included, is used up. */
  check(now: Date): void {
    const quota = this.plan().quotas[this.metric];
    if (!quota) return;
    const ceiling = quota.limit + quota.overage;
    if (this.meter.used(this.metric, now) < ceiling) return;
    const resetsAt = nextMonthStart(now);
    throw new ApiError(
      "RATE_LIMITED",
      `The workspace has used this month's ${this.what} allowance.`,
      {
        quota: this.metric,
        limit: quota.limit,
        limit_with_overage: ceiling,
        resets_at: resetsAt.toISOString(),
      },
      { headers: { "retry-after": String(Math.ceil((resetsAt.getTime() - now.getTime()) / 1000)) } },
    );
  }

  count(now: Date): void {
    this.meter.count(this.metric, now);
  }
}

/**
 * The monthly Management API allowance: every authenticated management request counts, except
 * GET /mgmt/v1/plan (and HEAD, and its path with a trailing slash: plan-route.ts), which keeps
 * answering after the allowance is used up so a vendor can see why.
 */
export class ManagementQuota {
  private readonly allowance: MonthlyAllowance;

  constructor(meter: UsageMeter, plan: () => PlanDefinition) {
    this.allowance = new MonthlyAllowance(MANAGEMENT_REQUESTS, "Management API", meter, plan);
  }

  admit(method: string, path: string, now: Date): void {
    if (isPlanReport(method, path)) return;
    this.allowance.check(now);
    this.allowance.count(now);
  }
}

/**
 * The monthly Runtime API allowance. Unlike management requests, a runtime request is counted
 * only once its answer is known (a LICENSE_REVOKED answer does not count, spec §4.2 rule 1), so
 * checking and counting are separate steps; see src/http/runtime-limits.ts for which answers count.
 */
export class RuntimeQuota {
  private readonly allowance: MonthlyAllowance;

  constructor(meter: UsageMeter, plan: () => PlanDefinition) {
    this.allowance = new MonthlyAllowance(RUNTIME_REQUESTS, "Runtime API", meter, plan);
  }

  check(now: Date): void {
    this.allowance.check(now);
  }

  count(now: Date): void {
    this.allowance.count(now);
  }
}
