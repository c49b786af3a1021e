import { and, eq, sum } from "drizzle-orm";
import type { Environment } from "../../domain/scopes.ts";
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
