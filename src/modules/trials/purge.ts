import { inArray, lt } from "drizzle-orm";
import type { Deps } from "../../deps.ts";
import { trialVerifications } from "../../store/schema/index.ts";
import { purgeInSteps } from "../../store/stepped-count.ts";

/** Verifications are needed for the 24-hour send limits and their 10 minutes; older ones go. */
const KEEP_VERIFICATIONS_MS = 2 * 86_400_000;
/** Verifications deleted per statement by the sweeper's purge (a few milliseconds of the thread). */
export const TRIAL_VERIFICATION_PURGE_BATCH = 1_000;

/**
 * Deletes trial verifications older than KEEP_VERIFICATIONS_MS, `batch` per statement (along the
 * created_at index) with a turn of the event loop between, from the sweeper: a start once did
 * it inside its own transaction, and after a restart the first start deleted the whole backlog.
 * Returns how many went.
 */
export function purgeTrialVerifications(
  deps: Pick<Deps, "db" | "clock">,
  batch = TRIAL_VERIFICATION_PURGE_BATCH,
  stopped: () => boolean = () => false,
): Promise<number> {
  const before = new Date(deps.clock.now().getTime() - KEEP_VERIFICATIONS_MS);
  return purgeInSteps(() => {
    if (stopped()) return null;
    const ids = deps.db
      .select({ id: trialVerifications.id })
      .from(trialVerifications)
      .where(lt(trialVerifications.createdAt, before))
      .limit(batch)
      .all()
      .map((row) => row.id);
    if (ids.length === 0) return null;
    return deps.db
      .delete(trialVerifications)
      .where(inArray(trialVerifications.id, ids))
      .returning({ id: trialVerifications.id })
      .all().length;
  });
}
