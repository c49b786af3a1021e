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

  /**
   * Throws 429 RATE_LIMITED once the month's allowance, overage included, is used up, taking
   * `pending` requests that may still count as used.
   */
  check(now: Date, pending = 0): void {
    const quota = this.plan().quotas[this.metric];
    if (!quota) return;
    const ceiling = quota.limit + quota.overage;
    if (this.meter.used(this.metric, now) + pending < ceiling) return;
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
 * Between them the request holds a place: requests let through and not answered yet count as used,
 * so calls in flight together (device calls wait for a shared commit) cannot pass the ceiling.
 */
export class RuntimeQuota {
  private readonly allowance: MonthlyAllowance;
  /**
   * Places held by requests in flight. Not per month: at the turn of a month the last month's few
   * stand in the new one's way until answered, while that month has nearly all of it left.
   */
  private held = 0;

  constructor(meter: UsageMeter, plan: () => PlanDefinition) {
    this.allowance = new MonthlyAllowance(RUNTIME_REQUESTS, "Runtime API", meter, plan);
  }

  /** Throws 429 RATE_LIMITED once the allowance is used up, places held included. */
  check(now: Date): void {
    this.allowance.check(now, this.held);
  }

  /** A request let through holds a place until `settle`, which must follow exactly once. */
  hold(): void {
    this.held++;
  }

  /** The answer to a held request is out: gives its place back and counts it if it counts. */
  settle(now: Date, counts: boolean): void {
    if (this.held > 0) this.held--;
    if (counts) this.allowance.count(now);
  }
}
