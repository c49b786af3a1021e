import { randomBytes } from "node:crypto";
import { eq } from "drizzle-orm";
import type { SecretBox } from "../../crypto/secret-box.ts";
import type { Deps } from "../../deps.ts";
import { ApiError } from "../../http/errors.ts";
import type { Db } from "../../store/db.ts";
import {
  licenseAssignments,
  licenseUsers,
  namedUserActivations,
  namedUserTokens,
} from "../../store/schema/index.ts";

/** The named-user token lasts 5 minutes (spec §8), is single use and bound to a license and a device key. */
export const NAMED_USER_TOKEN_TTL_SEC = 300;

/** A transaction handle or the database itself (inside an outer transaction). */
type Writer = Pick<Db, "select" | "insert" | "update">;

export const newNamedUserToken = (): string => `nut_${randomBytes(32).toString("base64url")}`;

/** Only this HMAC is stored; the token itself exists only in the confirm response. */
export const namedUserTokenHash = (secrets: SecretBox, token: string): string =>
  secrets.lookupHash(token, "named-user-token");

const tokenInvalid = () =>
  new ApiError(
    "NAMED_USER_TOKEN_INVALID",
    "The named_user_token is missing, expired, used or not for this device.",
  );

export const assignmentUnavailable = () =>
  new ApiError(
    "NAMED_USER_ASSIGNMENT_UNAVAILABLE",
    "The user's assignment to this license, the user or the license changed.",
  );

/**
 * Activation create of a named-user license: spends the token and returns the assignment it
 * stands for. Call inside the activation's transaction, so a refused activation leaves it unspent.
 */
export function redeemNamedUserToken(
  deps: Pick<Deps, "secrets">,
  tx: Writer,
  token: string | undefined,
  licenseId: string,
  deviceThumbprint: string,
  now: Date,
): string {
  if (!token) throw tokenInvalid();
  const hash = namedUserTokenHash(deps.secrets, token);
  const row = tx.select().from(namedUserTokens).where(eq(namedUserTokens.tokenHash, hash)).get();
  if (
    !row ||
    row.usedAt !== null ||
    row.expiresAt.getTime() <= now.getTime() ||
    row.licenseId !== licenseId ||
    row.deviceThumbprint !== deviceThumbprint
  ) {
    throw tokenInvalid();
  }
  const assignment = tx
    .select()
    .from(licenseAssignments)
    .where(eq(licenseAssignments.id, row.assignmentId))
    .get();
  const user = tx.select().from(licenseUsers).where(eq(licenseUsers.id, row.userId)).get();
  if (assignment?.status !== "active" || user?.status !== "active") throw assignmentUnavailable();
  tx.update(namedUserTokens).set({ usedAt: now }).where(eq(namedUserTokens.tokenHash, hash)).run();
  return row.assignmentId;
}

/** Records which assignment an activation holds (a re-activation may move it to another user). */
export function bindNamedUserActivation(tx: Writer, activationId: string, assignmentId: string): void {
  tx.insert(namedUserActivations)
    .values({ activationId, assignmentId })
    .onConflictDoUpdate({ target: namedUserActivations.activationId, set: { assignmentId } })
    .run();
}

/** Rule 1: whether a named-user activation's assignment and its user are still active: one indexed read. */
export function prepareAssignmentCheck(sqlite: Deps["sqlite"]): (activationId: string) => boolean {
  const statement = sqlite.prepare<{ ok: number }, [string]>(
    `SELECT (a.status = 'active' AND u.status = 'active') AS ok
       FROM named_user_activations n
       JOIN license_assignments a ON a.id = n.assignment_id
       JOIN license_users u ON u.id = a.user_id
      WHERE n.activation_id = ?`,
  );
  return (activationId) => statement.get(activationId)?.ok === 1;
}
