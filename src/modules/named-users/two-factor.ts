import { and, eq, isNull } from "drizzle-orm";
import { Secret, TOTP } from "otpauth";
import type { ChangeContext, Deps } from "../../deps.ts";
import { CROCKFORD_ALPHABET } from "../../domain/base32.ts";
import { ApiError } from "../../http/errors.ts";
import { assertIfMatch, type IfMatch } from "../../http/preconditions.ts";
import type { Db } from "../../store/db.ts";
import { licenseUsers, recoveryCodes } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import { APPROVAL_CODE_PATTERN } from "./passkey-approvals.ts";
import { bumpRevision, endRegistrationLinks, type PasskeyService } from "./passkeys.ts";
import { type LicenseUserRow, licenseUserEtag, type NamedUserService } from "./service.ts";

/**
 * Wrong second factors in a row, across verifications, before two-factor locks for the user (403
 * TWO_FACTOR_LOCKED until a vendor unlocks). Each try also needs a fresh emailed code and costs a
 * verification attempt, so ten leave a guesser ~10 tries per lock at a 1-in-10^6 (TOTP, ±1 step:
 * 3-in-10^6) chance each.
 */
export const TWO_FACTOR_MAX_FAILURES = 10;
export const RECOVERY_CODE_COUNT = 10;
const TOTP_PERIOD_SEC = 30;
/** One step either side: authenticator clocks drift. */
const TOTP_WINDOW = 1;
const ISSUER = "Licensing";

type Writer = Pick<Db, "update" | "insert" | "delete" | "select">;

export const secretContext = (userId: string) => `license_users:${userId}:totp`;
const recoveryPurpose = (userId: string) => `recovery-code:${userId}`;
/** Recovery codes are typed by people: any case, with or without the dash or spaces. */
const normalizeRecovery = (code: string) => code.toUpperCase().replace(/[\s-]/g, "");

const totpFor = (user: Pick<LicenseUserRow, "email">, secret: Secret) =>
  new TOTP({
    issuer: ISSUER,
    label: user.email,
    algorithm: "SHA1",
    digits: 6,
    period: TOTP_PERIOD_SEC,
    secret,
  });

/** 10 Crockford base32 characters (50 bits), shown as `XXXXX-XXXXX`. */
function recoveryCode(): string {
  const chars = Array.from(
    crypto.getRandomValues(new Uint8Array(10)),
    (b) => CROCKFORD_ALPHABET[b & 31],
  ).join("");
  return `${chars.slice(0, 5)}-${chars.slice(5)}`;
}

export type SecondFactorResult = "accepted" | "invalid";

/**
 * TOTP two-factor of license users: enrolment shows the secret and ten recovery codes once,
 * confirmation with a code turns it on; the secret is encrypted at rest, recovery codes are
 * HMACs and single use, and an accepted TOTP step is remembered so it is never accepted twice.
 */
export class TwoFactorService {
  constructor(
    private readonly deps: Deps,
    private readonly users: NamedUserService,
    private readonly passkeys: PasskeyService,
  ) {}

  /** TOTP on, or at least one passkey: confirmations then need a second factor. */
  required(user: LicenseUserRow): boolean {
    return user.totpStatus === "enabled" || this.passkeys.count(user.id) > 0;
  }

  /** The two-factor routes change the user (its ETag): each honours If-Match like PATCH does. */
  enrol(userId: string, ifMatch: IfMatch | undefined, ctx: ChangeContext) {
    const codes = Array.from({ length: RECOVERY_CODE_COUNT }, recoveryCode);
    const secret = new Secret({ size: 20 });
    const user = this.deps.db.transaction((tx) => {
      const current = this.users.get(userId, ctx.environment);
      assertIfMatch(ifMatch, licenseUserEtag(current));
      if (current.status !== "active")
        throw new ApiError("INVALID_TRANSITION", "The user is disabled.", { from: "disabled" });
      if (current.totpStatus === "enabled") {
        throw new ApiError(
          "INVALID_TRANSITION",
          "Two-factor is already on; disable it before enrolling again.",
          {
            from: "enabled",
          },
        );
      }
      const now = this.deps.clock.now();
      tx.update(licenseUsers)
        .set({
          totpStatus: "pending",
          totpSecret: this.deps.secrets.encrypt(secret.base32, secretContext(userId)),
          totpLastStep: null,
          secondFactorFailures: 0,
          twoFactorLockedAt: null,
          revision: current.revision + 1,
          updatedAt: now,
        })
        .where(eq(licenseUsers.id, userId))
        .run();
      this.replaceRecoveryCodes(tx, userId, codes);
      recordAudit(tx, this.deps, ctx, {
        type: "license_user.two_factor_enrolled",
        target: { type: "license_user", id: userId },
      });
      return current;
    });
    return {
      user_id: userId,
      otpauth_uri: totpFor(user, secret).toString(),
      secret: secret.base32,
      recovery_codes: codes,
    };
  }

  /** Turns an enrolment on once the user shows a code from the authenticator. */
  confirm(userId: string, code: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): LicenseUserRow {
    return this.deps.db.transaction((tx) => {
      const current = this.users.get(userId, ctx.environment);
      assertIfMatch(ifMatch, licenseUserEtag(current));
      if (current.totpStatus !== "pending") {
        throw new ApiError(
          "INVALID_TRANSITION",
          "There is no two-factor enrolment waiting for confirmation.",
          {
            from: current.totpStatus,
          },
        );
      }
      const step = this.totpStep(current, code);
      if (step === null) throw ApiError.validation({ code: ["the code does not match the enrolled secret"] });
      const next = {
        ...current,
        totpStatus: "enabled" as const,
        totpLastStep: step,
        revision: current.revision + 1,
        updatedAt: this.deps.clock.now(),
      };
      tx.update(licenseUsers).set(next).where(eq(licenseUsers.id, userId)).run();
      recordAudit(tx, this.deps, ctx, {
        type: "license_user.two_factor_enabled",
        target: { type: "license_user", id: userId },
      });
      return next;
    });
  }

  disable(userId: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    this.deps.db.transaction((tx) => {
      const current = this.users.get(userId, ctx.environment);
      assertIfMatch(ifMatch, licenseUserEtag(current));
      // A link sent before would register a passkey after this, and turn two-factor back on.
      const linksEnded = endRegistrationLinks(tx, userId, this.deps.clock.now());
      if (current.totpStatus === "none" && this.passkeys.count(userId) === 0 && linksEnded === 0) return;
      this.passkeys.deleteAll(tx, userId);
      tx.update(licenseUsers)
        .set({
          totpStatus: "none",
          totpSecret: null,
          totpLastStep: null,
          secondFactorFailures: 0,
          twoFactorLockedAt: null,
          revision: current.revision + 1,
          updatedAt: this.deps.clock.now(),
        })
        .where(eq(licenseUsers.id, userId))
        .run();
      tx.delete(recoveryCodes).where(eq(recoveryCodes.userId, userId)).run();
      recordAudit(tx, this.deps, ctx, {
        type: "license_user.two_factor_disabled",
        target: { type: "license_user", id: userId },
      });
    });
  }

  unlock(userId: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): LicenseUserRow {
    return this.deps.db.transaction((tx) => {
      const current = this.users.get(userId, ctx.environment);
      assertIfMatch(ifMatch, licenseUserEtag(current));
      if (current.twoFactorLockedAt === null && current.secondFactorFailures === 0) return current;
      const next = {
        ...current,
        secondFactorFailures: 0,
        twoFactorLockedAt: null,
        revision: current.revision + 1,
        updatedAt: this.deps.clock.now(),
      };
      tx.update(licenseUsers).set(next).where(eq(licenseUsers.id, userId)).run();
      recordAudit(tx, this.deps, ctx, {
        type: "license_user.two_factor_unlocked",
        target: { type: "license_user", id: userId },
      });
      return next;
    });
  }

  /**
   * Checks a second factor at email confirmation: six digits are a TOTP code, eight digits a
   * passkey approval code of this verification, anything else a recovery code. Writes through `tx` (the step, the used recovery code, the failure count and
   * the lock), which the caller commits whatever it answers.
   */
  verify(tx: Writer, user: LicenseUserRow, code: string, verificationId: string): SecondFactorResult {
    let accepted = false;
    // A pending enrolment is not two-factor yet (api.md: pending until confirmed; nobody has shown
    // the authenticator holds the secret): its codes count only at the vendor's confirm, and its
    // recovery codes not at all until then.
    const totpOn = user.totpStatus === "enabled";
    if (APPROVAL_CODE_PATTERN.test(code)) {
      accepted = this.passkeys.approvals.redeem(tx, verificationId, code);
      if (accepted)
        tx.update(licenseUsers).set({ secondFactorFailures: 0 }).where(eq(licenseUsers.id, user.id)).run();
    } else if (/^[0-9]{6}$/.test(code)) {
      const step = totpOn ? this.totpStep(user, code) : null;
      if (step !== null) {
        accepted = true;
        tx.update(licenseUsers)
          .set({ totpLastStep: step, secondFactorFailures: 0 })
          .where(eq(licenseUsers.id, user.id))
          .run();
      }
    } else if (totpOn) {
      const hash = this.deps.secrets.lookupHash(normalizeRecovery(code), recoveryPurpose(user.id));
      const used = tx
        .update(recoveryCodes)
        .set({ usedAt: this.deps.clock.now() })
        .where(
          and(
            eq(recoveryCodes.userId, user.id),
            eq(recoveryCodes.codeHash, hash),
            isNull(recoveryCodes.usedAt),
          ),
        )
        .returning({ userId: recoveryCodes.userId })
        .all();
      if (used.length === 1) {
        accepted = true;
        tx.update(licenseUsers).set({ secondFactorFailures: 0 }).where(eq(licenseUsers.id, user.id)).run();
        bumpRevision(tx, user.id, this.deps.clock.now()); // one recovery code fewer
      }
    }
    if (accepted) return "accepted";
    const failures = user.secondFactorFailures + 1;
    const locks = failures >= TWO_FACTOR_MAX_FAILURES;
    tx.update(licenseUsers)
      .set({
        secondFactorFailures: failures,
        twoFactorLockedAt: locks ? this.deps.clock.now() : null,
      })
      .where(eq(licenseUsers.id, user.id))
      .run();
    if (locks && user.twoFactorLockedAt === null) bumpRevision(tx, user.id, this.deps.clock.now());
    return "invalid";
  }

  /** The TOTP step a code belongs to, if it matches within the window and is newer than the last accepted one. */
  private totpStep(user: LicenseUserRow, code: string): number | null {
    if (!user.totpSecret) return null;
    const secret = Secret.fromBase32(this.deps.secrets.decrypt(user.totpSecret, secretContext(user.id)));
    const timestamp = this.deps.clock.now().getTime();
    const delta = totpFor(user, secret).validate({ token: code, timestamp, window: TOTP_WINDOW });
    if (delta === null) return null;
    const step = Math.floor(timestamp / 1000 / TOTP_PERIOD_SEC) + delta;
    return user.totpLastStep !== null && step <= user.totpLastStep ? null : step;
  }

  private replaceRecoveryCodes(tx: Writer, userId: string, codes: string[]): void {
    tx.delete(recoveryCodes).where(eq(recoveryCodes.userId, userId)).run();
    tx.insert(recoveryCodes)
      .values(
        codes.map((code) => ({
          userId,
          codeHash: this.deps.secrets.lookupHash(normalizeRecovery(code), recoveryPurpose(userId)),
          usedAt: null,
        })),
      )
      .run();
  }
}
