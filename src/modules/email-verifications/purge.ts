import { inArray, lt } from "drizzle-orm";
import type { Deps } from "../../deps.ts";
import { emailVerifications, namedUserTokens, passkeyApprovals } from "../../store/schema/index.ts";
import { purgeInSteps } from "../../store/stepped-count.ts";

/** Verifications, their approvals and tokens are kept this long (the limits look back 24 hours), then purged. */
export const KEEP_VERIFICATIONS_MS = 2 * 86_400_000;
/** Rows deleted per statement by the purge (a few milliseconds of the thread that serves heartbeats). */
export const EMAIL_VERIFICATION_PURGE_BATCH = 1_000;

/**
 * Deletes verifications older than two days (long closed or expired: codes last 10 minutes),
 * their passkey approvals, and named-user tokens expired as long. Unauthenticated starts write
 * a row each, so without this the store would only grow. `batch` rows per statement, with a
 * turn of the event loop between (the sweeper runs it; one DELETE of a backlog held the thread
 * that serves heartbeats). Returns how many rows went.
 */
export async function purgeEmailVerifications(
  deps: Pick<Deps, "db" | "clock">,
  batch = EMAIL_VERIFICATION_PURGE_BATCH,
  stopped: () => boolean = () => false,
): Promise<number> {
  const before = new Date(deps.clock.now().getTime() - KEEP_VERIFICATIONS_MS);
  const { db } = deps;
  // A batch of verifications (along the created_at index) with their approvals, in one
  // transaction so no approval outlives its verification; then the tokens, a batch at a time.
  const verifications = await purgeInSteps(() => {
    if (stopped()) return null;
    return db.transaction((tx) => {
      const ids = tx
        .select({ id: emailVerifications.id })
        .from(emailVerifications)
        .where(lt(emailVerifications.createdAt, before))
        .limit(batch)
        .all()
        .map((row) => row.id);
      if (ids.length === 0) return null;
      const approvals = tx
        .delete(passkeyApprovals)
        .where(inArray(passkeyApprovals.verificationId, ids))
        .returning({ id: passkeyApprovals.verificationId })
        .all().length;
      const rows = tx
        .delete(emailVerifications)
        .where(inArray(emailVerifications.id, ids))
        .returning({ id: emailVerifications.id })
        .all().length;
      return approvals + rows;
    });
  });
  const tokens = await purgeInSteps(() => {
    if (stopped()) return null;
    const hashes = db
      .select({ hash: namedUserTokens.tokenHash })
      .from(namedUserTokens)
      .where(lt(namedUserTokens.expiresAt, before))
      .limit(batch)
      .all()
      .map((row) => row.hash);
    if (hashes.length === 0) return null;
    return db
      .delete(namedUserTokens)
      .where(inArray(namedUserTokens.tokenHash, hashes))
      .returning({ hash: namedUserTokens.tokenHash })
      .all().length;
  });
  return verifications + tokens;
}
