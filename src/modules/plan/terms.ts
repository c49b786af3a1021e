import { ApiError } from "../../http/errors.ts";
import { type PlanTerms, planChanges, type WorkspaceService } from "../workspace/service.ts";
import { isPlanReport } from "./plan-route.ts";

/** How long a plan read by this process is trusted before another process's change is looked for. */
const MAX_AGE_MS = 1_000;

/**
 * The workspace plan as every request needs it, without a store read per request: kept for up to
 * a second (real time, not the service clock), and dropped at once when this process changes it.
 * `licensing plan set` from another process therefore takes effect within a second.
 */
export class PlanCache {
  private cached: PlanTerms | null = null;
  private generation = -1;
  private readAt = 0;

  constructor(private readonly workspace: Pick<WorkspaceService, "terms">) {}

  current(): PlanTerms {
    const at = performance.now();
    if (this.cached === null || this.generation !== planChanges.generation || at - this.readAt > MAX_AGE_MS) {
      this.generation = planChanges.generation;
      this.cached = this.workspace.terms();
      this.readAt = at;
    }
    return this.cached;
  }
}

/**
 * Spec §4.1 and §7.2: once the workspace trial or subscription has ended, every Runtime and
 * Management operation answers 402 PLAN_ENDED, except GET /mgmt/v1/plan (and HEAD, and its path
 * with a trailing slash: plan-route.ts), so the vendor can see why.
 */
export class PlanGate {
  constructor(private readonly plans: PlanCache) {}

  admit(method: string, path: string, now: Date): void {
    const terms = this.plans.current();
    if (terms.endsAt === null || now.getTime() < terms.endsAt.getTime() || isPlanReport(method, path)) return;
    throw new ApiError(
      "PLAN_ENDED",
      terms.trial ? "The workspace trial has ended." : "The workspace subscription has ended.",
      { plan: terms.plan.code, trial: terms.trial, ended_at: terms.endsAt.toISOString() },
    );
  }
}
