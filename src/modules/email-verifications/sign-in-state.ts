import { eq } from "drizzle-orm";
import type { SecretBox } from "../../crypto/secret-box.ts";
import { licenseStatus } from "../../domain/license-state.ts";
import { CODE_MAX_ATTEMPTS } from "../../domain/verification-code.ts";
import type { Db } from "../../store/db.ts";
import {
  type emailVerifications,
  licenseAssignments,
  licenses,
  licenseUsers,
  policies,
} from "../../store/schema/index.ts";
import type { VerificationLimits } from "./limits.ts";

/**
 * What a named user's sign-in needs besides the codes themselves, asked by the confirm and by the
 * passkey approval page (which must not hand out an approval code for a sign-in that can no longer
 * succeed: entering it would only cost the user an attempt).
 */

export type VerificationRow = typeof emailVerifications.$inferSelect;
type Reader = Pick<Db, "select">;

/**
 * The mailbox limits' key, and what ties a verification to the address its code was mailed to:
 * the address alone, since one mailbox gets codes from both environments (trial sends count so).
 */
export const mailboxHash = (secrets: SecretBox, emailNormalized: string): string =>
  secrets.lookupHash(emailNormalized, "email-verification-mailbox");

/**
 * Whether the code went to this address. A row written before the key dropped the environment
 * carries the older key: accepted too, so a sign-in under way across the upgrade still confirms
 * (a code lasts 10 minutes; the older rows only age out of the mailbox counts, over a day).
 */
function mailedTo(secrets: SecretBox, row: VerificationRow, emailNormalized: string): boolean {
  const older = `${row.environment}\0${emailNormalized}`;
  return (
    row.addressHash === mailboxHash(secrets, emailNormalized) ||
    row.addressHash === secrets.lookupHash(older, "email-verification-address")
  );
}

/**
 * Rule 8: the assignment, user, license and policy the code was sent for, if all still hold. The
 * user must still have the address the code went to: a vendor who changes a user's address (a
 * mailbox lost or taken over) cuts off a sign-in under way through the old one.
 */
export function currentSignInState(secrets: SecretBox, tx: Reader, row: VerificationRow, now: Date) {
  if (!row.licenseId || !row.userId || !row.assignmentId) return null;
  const assignment = tx
    .select()
    .from(licenseAssignments)
    .where(eq(licenseAssignments.id, row.assignmentId))
    .get();
  const user = tx.select().from(licenseUsers).where(eq(licenseUsers.id, row.userId)).get();
  const license = tx.select().from(licenses).where(eq(licenses.id, row.licenseId)).get();
  const policy = license
    ? tx.select().from(policies).where(eq(policies.id, license.policyId)).get()
    : undefined;
  if (
    assignment?.status !== "active" ||
    user?.status !== "active" ||
    !mailedTo(secrets, row, user.emailNormalized) ||
    !license ||
    licenseStatus(license, now) !== "active" ||
    policy?.identityMode !== "named_user"
  ) {
    return null;
  }
  return { user, licenseId: license.id, assignmentId: assignment.id };
}

/**
 * Where a verification stands for a second factor, before any code is compared: `open` while a
 * confirm with the right codes would succeed; `locked` when the user's two-factor is locked
 * (confirm answers 403 TWO_FACTOR_LOCKED); `ended` when it is used, replaced, expired, out of
 * attempts, past its subject's wrong-code budget (confirm answers 410) or its assignment, user,
 * license or address changed (403 NAMED_USER_ASSIGNMENT_UNAVAILABLE).
 */
export function secondFactorState(
  secrets: SecretBox,
  limits: VerificationLimits,
  tx: Reader,
  row: VerificationRow,
  now: Date,
): "open" | "locked" | "ended" {
  if (
    row.closedAt !== null ||
    row.expiresAt.getTime() <= now.getTime() ||
    row.attempts >= CODE_MAX_ATTEMPTS ||
    !limits.withinFailureBudget(row.subjectHash, now)
  ) {
    return "ended";
  }
  const state = currentSignInState(secrets, tx, row, now);
  if (!state) return "ended";
  return state.user.twoFactorLockedAt !== null ? "locked" : "open";
}
