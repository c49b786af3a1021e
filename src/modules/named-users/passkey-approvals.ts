import { randomBytes } from "node:crypto";
import { and, eq, isNull } from "drizzle-orm";
import { constantTimeEqual } from "../../crypto/constant-time.ts";
import { type RelyingParty, verifyAssertion, WebAuthnError } from "../../crypto/webauthn.ts";
import type { Deps } from "../../deps.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import { ApiError } from "../../http/errors.ts";
import type { Db } from "../../store/db.ts";
import { emailVerifications, passkeyApprovals, passkeys } from "../../store/schema/index.ts";
import { VerificationLimits } from "../email-verifications/limits.ts";
import { secondFactorState } from "../email-verifications/sign-in-state.ts";

/** Approval codes are eight digits: told apart from six-digit TOTP codes and `XXXXX-XXXXX` recovery codes. */
export const APPROVAL_CODE_PATTERN = /^[0-9]{8}$/;

type Writer = Pick<Db, "select" | "insert" | "update" | "delete">;

const b64u = (text: string): Uint8Array => new Uint8Array(Buffer.from(text, "base64url"));
const approvalGone = () =>
  new ApiError(
    "EMAIL_VERIFICATION_EXPIRED",
    "This approval link is unknown, used or expired, or its sign-in can no longer succeed; start again in the app.",
  );
const twoFactorLocked = () =>
  new ApiError(
    "TWO_FACTOR_LOCKED",
    "Two-factor is locked for this user after too many wrong second factors; the vendor must unlock it.",
  );
const refused = (error: unknown) =>
  new ApiError("TWO_FACTOR_INVALID", "The passkey did not verify.", {
    reason: error instanceof WebAuthnError ? error.message : "invalid",
  });

export interface ApprovalBody {
  verification_id: string;
  secret: string;
  credential_id: string;
  client_data_json: string;
  authenticator_data: string;
  signature: string;
}

/**
 * The approval half of passkeys (spec §4.2 rule 7): each verification mail of a user with passkeys
 * carries an approval link, valid for that verification only; a WebAuthn assertion there yields
 * the verification's eight-digit approval code, which the app sends as `second_factor_code`, once.
 */
export class PasskeyApprovals {
  private readonly limits: VerificationLimits;

  constructor(
    private readonly deps: Deps,
    private readonly rp: RelyingParty,
    private readonly baseUrl: string,
    /** The workspace's plan: confirm refuses every code once it lacks email license verification. */
    private readonly plan: () => PlanDefinition,
  ) {
    this.limits = new VerificationLimits(deps.sqlite);
  }

  /** Written at every start, matched or not, so both cost the same; the link goes out only to passkey users. */
  newApproval(tx: Writer, verificationId: string): string {
    const secret = randomBytes(32).toString("base64url");
    tx.insert(passkeyApprovals)
      .values({
        verificationId,
        secretHash: this.hash(secret, `passkey-approval:${verificationId}`),
        challenge: null,
        codeHash: null,
        usedAt: null,
      })
      .run();
    return secret;
  }

  approvalUrl(verificationId: string, secret: string): string {
    return `${this.baseUrl}/passkeys/v1/approve#${verificationId}.${secret}`;
  }

  approvalOptions(verificationId: string, secret: string) {
    return this.deps.db.transaction((tx) => {
      const { userId } = this.openApproval(tx, verificationId, secret);
      const challenge = randomBytes(32).toString("base64url");
      tx.update(passkeyApprovals)
        .set({ challenge })
        .where(eq(passkeyApprovals.verificationId, verificationId))
        .run();
      const allowed = tx
        .select({ id: passkeys.credentialId })
        .from(passkeys)
        .where(eq(passkeys.userId, userId))
        .all();
      return { challenge, rp_id: this.rp.id, allow_credentials: allowed.map((row) => row.id) };
    });
  }

  /**
   * Verifies the assertion and returns the verification's approval code, the same one at every
   * approval (approvalCode); the challenge is spent either way.
   */
  approve(body: ApprovalBody) {
    const outcome = this.deps.db.transaction((tx) => {
      const { userId, approval, expiresAt } = this.openApproval(tx, body.verification_id, body.secret);
      if (!approval.challenge) return new ApiError("INVALID_REQUEST", "Ask for approval options first.");
      tx.update(passkeyApprovals)
        .set({ challenge: null })
        .where(eq(passkeyApprovals.verificationId, approval.verificationId))
        .run();
      const credential = tx
        .select()
        .from(passkeys)
        .where(and(eq(passkeys.credentialId, body.credential_id), eq(passkeys.userId, userId)))
        .get();
      if (!credential) return refused(new WebAuthnError("not a passkey of this user"));
      let signCount: number;
      try {
        signCount = verifyAssertion({
          key: credential.publicKey,
          storedSignCount: credential.signCount,
          clientDataJson: b64u(body.client_data_json),
          authenticatorData: b64u(body.authenticator_data),
          signature: b64u(body.signature),
          challenge: approval.challenge,
          rp: this.rp,
        });
      } catch (error) {
        if (error instanceof WebAuthnError) return refused(error);
        throw error;
      }
      const now = this.deps.clock.now();
      tx.update(passkeys).set({ signCount, lastUsedAt: now }).where(eq(passkeys.id, credential.id)).run();
      const code = this.approvalCode(approval);
      tx.update(passkeyApprovals)
        .set({ codeHash: this.codeHash(approval.verificationId, code) })
        .where(eq(passkeyApprovals.verificationId, approval.verificationId))
        .run();
      return { approval_code: code, expires_at: expiresAt.toISOString() };
    });
    if (outcome instanceof ApiError) throw outcome;
    return outcome;
  }

  /** At confirmation: the approval code of this verification, once. */
  redeem(tx: Writer, verificationId: string, code: string): boolean {
    if (!APPROVAL_CODE_PATTERN.test(code)) return false;
    const used = tx
      .update(passkeyApprovals)
      .set({ usedAt: this.deps.clock.now() })
      .where(
        and(
          eq(passkeyApprovals.verificationId, verificationId),
          eq(passkeyApprovals.codeHash, this.codeHash(verificationId, code)),
          isNull(passkeyApprovals.usedAt),
        ),
      )
      .returning({ id: passkeyApprovals.verificationId })
      .all();
    return used.length === 1;
  }

  private hash(secret: string, purpose: string): string {
    return this.deps.secrets.lookupHash(secret, purpose);
  }

  /**
   * A verification's approval code: the same whenever its sign-in is approved, so a second tab or
   * device shows the code the first one showed, and both keep working (a fresh code at each
   * approval silently ended the first, and entering it then cost an attempt and a step towards the
   * lock). It is derived, not stored: an HMAC under the data key's lookup key of the verification
   * and its approval's secret hash (random per start). Whoever holds that key and the store can
   * compute it, but they could already find it from the stored code hash by trying the 10^8 codes,
   * so this keeps nothing the hash did not. It works only once an assertion has verified (redeem
   * compares with the hash written then). 64 bits reduced mod 10^8: the bias is below 10^-11.
   */
  private approvalCode(approval: { verificationId: string; secretHash: string }): string {
    const digest = this.hash(
      `${approval.verificationId}\0${approval.secretHash}`,
      "passkey-approval-code-derivation",
    );
    return String(BigInt(`0x${digest.slice(0, 16)}`) % 100_000_000n).padStart(8, "0");
  }

  private codeHash(verificationId: string, code: string): string {
    return this.hash(`${verificationId}\0${code}`, "passkey-approval-code");
  }

  /**
   * The approval of a matched verification whose secret is right and whose sign-in can still
   * succeed (the checks confirm makes before comparing a second factor): 403 TWO_FACTOR_LOCKED
   * while the user's two-factor is locked; anything else is 410. Asked by the options and again
   * by the approval, so a change the vendor makes while the page is open counts.
   */
  private openApproval(tx: Writer, verificationId: string, secret: string) {
    const approval = tx
      .select()
      .from(passkeyApprovals)
      .where(eq(passkeyApprovals.verificationId, verificationId))
      .get();
    const verification = tx
      .select()
      .from(emailVerifications)
      .where(eq(emailVerifications.id, verificationId))
      .get();
    const now = this.deps.clock.now();
    // Checked first and always: every start has an approval, with or without a user, and a wrong
    // secret must cost the same for both (the check after it would skip the hash for one of them).
    const secretMatches = constantTimeEqual(
      approval?.secretHash ?? "",
      this.hash(secret, `passkey-approval:${verificationId}`),
    );
    if (!approval || !secretMatches || !verification?.userId || approval.usedAt !== null) {
      throw approvalGone();
    }
    // Past the secret: only the mailbox the link went to learns where its sign-in stands.
    const state = secondFactorState(this.deps.secrets, this.limits, tx, verification, now);
    if (state === "locked") throw twoFactorLocked();
    if (state === "ended" || !hasFeature(this.plan(), "email_license_verification")) throw approvalGone();
    return { userId: verification.userId, approval, expiresAt: verification.expiresAt };
  }
}
