import { and, eq, isNull, ne, or } from "drizzle-orm";
import type { Deps } from "../../deps.ts";
import { DEFAULT_PLAN_CODE, PLANS, type PlanDefinition, planByCode, storedPlan } from "../../domain/plans.ts";
import { type Actor, workspace } from "../../store/schema/index.ts";
import { recordInBothEnvironments } from "../events/service.ts";

export const WORKSPACE_ID = "default";

/** The plan and its term: whether it is a trial, and when it ends (null: it does not). */
export interface PlanTerms {
  plan: PlanDefinition;
  trial: boolean;
  endsAt: Date | null;
}

/**
 * Bumped by every plan change made in this process, so a cached copy of the plan (PlanCache) sees
 * it at once; changes made by another process (`licensing plan set`) are seen within its max age.
 */
export const planChanges = { generation: 0 };

/** The single workspace row of an install, and its plan. */
export class WorkspaceService {
  /** `sqlite` queues the audit events of plan changes for webhooks, in the change's transaction. */
  constructor(private readonly deps: Pick<Deps, "db" | "sqlite" | "clock" | "ids">) {}

  exists(): boolean {
    return this.deps.db.select({ id: workspace.id }).from(workspace).get() !== undefined;
  }

  /** Creates the workspace once; later calls change nothing. */
  ensure(name = "Default workspace"): void {
    const now = this.deps.clock.now();
    this.deps.db
      .insert(workspace)
      .values({ id: WORKSPACE_ID, name, planCode: DEFAULT_PLAN_CODE, createdAt: now, updatedAt: now })
      .onConflictDoNothing()
      .run();
  }

  /** Read on each call (one indexed row) so `licensing plan set` takes effect without a restart. */
  plan(): PlanDefinition {
    const row = this.deps.db
      .select({ planCode: workspace.planCode })
      .from(workspace)
      .where(eq(workspace.id, WORKSPACE_ID))
      .get();
    return storedPlan(row?.planCode);
  }

  terms(): PlanTerms {
    const row = this.deps.db
      .select({ planCode: workspace.planCode, endsAt: workspace.planEndsAt, trial: workspace.planTrial })
      .from(workspace)
      .where(eq(workspace.id, WORKSPACE_ID))
      .get();
    const plan = storedPlan(row?.planCode);
    return { plan, trial: row?.trial ?? false, endsAt: row?.endsAt ?? null };
  }

  /**
   * Noted by `licensing serve` at each start, so command-line commands name the service as its
   * clients reach it without being told (an operator's shell seldom has the unit's environment).
   * Written only when it changed: a start writes nothing otherwise.
   */
  recordBaseUrl(baseUrl: string): void {
    this.deps.db
      .update(workspace)
      .set({ baseUrl })
      .where(
        and(eq(workspace.id, WORKSPACE_ID), or(isNull(workspace.baseUrl), ne(workspace.baseUrl, baseUrl))),
      )
      .run();
  }

  /** The base URL the last server on this store ran with, if one ever ran. */
  recordedBaseUrl(): string | null {
    return (
      this.deps.db
        .select({ baseUrl: workspace.baseUrl })
        .from(workspace)
        .where(eq(workspace.id, WORKSPACE_ID))
        .get()?.baseUrl ?? null
    );
  }

  /**
   * With an `actor`, the change is audited in both environments: the plan governs both. A plan is
   * set with its whole term: without `endsAt` it does not end, without `trial` it is not a trial.
   */
  setPlan(code: string, actor?: Actor, term: { endsAt?: Date | null; trial?: boolean } = {}): PlanDefinition {
    const plan = planByCode(code);
    if (!plan) throw new Error(`unknown plan "${code}"; choose one of ${Object.keys(PLANS).join(", ")}`);
    const endsAt = term.endsAt ?? null;
    const trial = term.trial ?? false;
    // One transaction: a plan change that could not be audited is not made.
    this.deps.db.transaction((tx) => {
      tx.update(workspace)
        .set({ planCode: plan.code, planEndsAt: endsAt, planTrial: trial, updatedAt: this.deps.clock.now() })
        .where(eq(workspace.id, WORKSPACE_ID))
        .run();
      if (actor) {
        recordInBothEnvironments(
          tx,
          this.deps,
          { actor, requestId: null },
          {
            type: "workspace.plan_changed",
            target: { type: "workspace", id: WORKSPACE_ID },
            data: { plan: plan.code, trial, ends_at: endsAt?.toISOString() ?? null },
          },
        );
      }
    });
    // Once committed: a rolled-back change has nothing for a cached copy to see.
    planChanges.generation++;
    return plan;
  }
}
