import type { PlanDefinition } from "../../domain/plans.ts";
import { ApiError } from "../../http/errors.ts";
import { nextMonthStart, type UsageMeter } from "./usage-meter.ts";

export const MANAGEMENT_REQUESTS = "management_requests";

/** The one management route the monthly allowance never refuses (spec §4.3). */
const isExempt = (method: string, path: string) => method === "GET" && path === "/mgmt/v1/plan";

/**
 * The monthly Management API allowance: every authenticated management request counts, except
 * GET /mgmt/v1/plan, which keeps answering after the allowance is used up so a vendor can see why.
 */
export class ManagementQuota {
  constructor(
    private readonly meter: UsageMeter,
    private readonly plan: () => PlanDefinition,
  ) {}

  admit(method: string, path: string, now: Date): void {
    if (isExempt(method, path)) return;
    const quota = this.plan().quotas[MANAGEMENT_REQUESTS];
    if (!quota) return;
    const ceiling = quota.limit + quota.overage;
    if (this.meter.used(MANAGEMENT_REQUESTS, now) >= ceiling) {
      const resetsAt = nextMonthStart(now);
      throw new ApiError(
        "RATE_LIMITED",
        "The workspace has used this month's Management API allowance.",
        {
          quota: MANAGEMENT_REQUESTS,
          limit: quota.limit,
          limit_with_overage: ceiling,
          resets_at: resetsAt.toISOString(),
        },
        { headers: { "retry-after": String(Math.ceil((resetsAt.getTime() - now.getTime()) / 1000)) } },
      );
    }
    this.meter.count(MANAGEMENT_REQUESTS, now);
  }
}
