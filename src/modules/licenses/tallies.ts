import { and, eq, sum } from "drizzle-orm";
import type { PlanDefinition } from "../../domain/plans.ts";
import type { PolicySettings } from "../../domain/policy-rules.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import type { Db } from "../../store/db.ts";
import { licenseTallies } from "../../store/schema/index.ts";

/**
 * Licenses of an environment that are not revoked (of one license type, when given), as the plan's
 * quotas count them: read from the tally the triggers keep (migration 0036), one row per type.
 */
export function unrevokedLicenses(db: Db, environment: Environment, licenseType?: string): number {
  const row = db
    .select({ n: sum(licenseTallies.unrevoked) })
    .from(licenseTallies)
    .where(
      and(
        eq(licenseTallies.environment, environment),
        licenseType === undefined ? undefined : eq(licenseTallies.licenseType, licenseType),
      ),
    )
    .get();
  return Number(row?.n ?? 0);
}

/**
 * Plan quotas count live licenses that are not revoked (all, and trials separately); test
 * licenses are free, so a test key can never use up the live allowance.
 */
export function checkLicenseQuota(
  db: Db,
  plan: PlanDefinition,
  licenseType: PolicySettings["license_type"],
  environment: Environment,
): void {
  if (environment !== "live") return;
  const checks: [string, string | undefined][] = [["licenses", undefined]];
  if (licenseType === "trial") checks.push(["trial_licenses", "trial"]);
  for (const [quota, type] of checks) {
    const limit = plan.quotas[quota]?.limit;
    if (limit === undefined) continue;
    const used = unrevokedLicenses(db, "live", type);
    if (used >= limit) {
      throw new ApiError("PLAN_QUOTA_EXCEEDED", `The plan allows ${limit} ${quota.replace("_", " ")}.`, {
        quota,
        limit,
        used,
      });
    }
  }
}
