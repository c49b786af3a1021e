import { and, asc, desc, eq, isNull, sql } from "drizzle-orm";
import { parsePublicKey, thumbprint } from "../../crypto/keys.ts";
import type { Deps } from "../../deps.ts";
import { canonicalLicenseKey } from "../../domain/license-key.ts";
import { licenseStatus } from "../../domain/license-state.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import {
  CODE_LENGTH,
  CODE_TTL_SEC,
  checkCode,
  generateCode,
  hashCode,
} from "../../domain/verification-code.ts";
import { emailField } from "../../http/email-field.ts";
import { ApiError } from "../../http/errors.ts";
import type { MailOutbox } from "../../mail/outbox.ts";
import { emailVerifications, namedUserTokens, policies, products } from "../../store/schema/index.ts";
import type { LicenseService } from "../licenses/service.ts";
import type { PasskeyService } from "../named-users/passkeys.ts";
import type { NamedUserService } from "../named-users/service.ts";
import type { TwoFactorService } from "../named-users/two-factor.ts";
import { VERIFICATION_SEND_LIMITS, VerificationLimits } from "./limits.ts";
import type { EmailVerificationConfirmBody, EmailVerificationStartBody } from "./model.ts";
import { purgeEmailVerifications } from "./purge.ts";
import { currentSignInState, mailboxHash, type VerificationRow } from "./sign-in-state.ts";
import {
  assignmentUnavailable,
  NAMED_USER_TOKEN_TTL_SEC,
  namedUserTokenHash,
  newNamedUserToken,
} from "./tokens.ts";

/** What the 202 tells a client to wait before asking for another code: a start sooner sends none. */
export const RESEND_AFTER_SEC = VERIFICATION_SEND_LIMITS.sameAddressGapSec;
const FEATURE = "email_license_verification";

type Writer = Parameters<Parameters<Deps["db"]["transaction"]>[0]>[0];

const planLacksFeature = () =>
  new ApiError(
    "PLAN_ENTITLEMENT_REQUIRED",
    "The workspace plan does not include email license verification.",
    {
      entitlement: FEATURE,
    },
  );

/**
 * Email verification for named-user licenses (spec §4.2 rules 6-8, §3.2): a start sends a code
 * only when rule 6 holds and answers the same either way, after the same work; a confirm checks
 * the code (counted attempt first), the device key and the second factor, and gives a single-use
 * token for one activation.
 */
export class EmailVerificationService {
  private readonly limits: VerificationLimits;

  constructor(
    private readonly deps: Deps,
    private readonly licenses: LicenseService,
    private readonly users: NamedUserService,
    private readonly twoFactor: TwoFactorService,
    private readonly passkeys: PasskeyService,
    private readonly mail: MailOutbox,
    private readonly plan: () => PlanDefinition,
  ) {
    this.limits = new VerificationLimits(deps.sqlite);
  }

  start(body: EmailVerificationStartBody) {
    const product = this.deps.db.select().from(products).where(eq(products.id, body.product_id)).get();
    if (!product) throw ApiError.notFound("product");
    if (!hasFeature(this.plan(), FEATURE)) throw planLacksFeature();
    const deviceKey = parsePublicKey(body.device_signing_public_key);
    if (!deviceKey)
      throw ApiError.validation({ device_signing_public_key: ["not an ed25519: or p256: public key"] });
    const email = emailField(body.email);
    const now = this.deps.clock.now();

    // From here on both outcomes do the same reads, HMACs, encryption and writes.
    const license = this.licenses.findByKey(body.license_key);
    const policy = license
      ? this.deps.db.select().from(policies).where(eq(policies.id, license.policyId)).get()
      : undefined;
    // One row of the same shape whether or not the address has a user, asked with a license id
    // that matches nothing when there is no license, so a non-matching address costs the same.
    const found = this.users.assignments.assignedUserByEmail(
      product.environment,
      email.normalized,
      license?.id ?? "",
    );
    const user =
      found.users === 1 && found.userId !== null && found.userEmail !== null
        ? { id: found.userId, email: found.userEmail }
        : undefined;
    const assignmentId = user ? found.assignmentId : null;
    const withPasskeys = this.passkeys.count(user?.id ?? "") > 0;
    const matched =
      license !== undefined &&
      license.productId === product.id &&
      licenseStatus(license, now) === "active" &&
      policy?.identityMode === "named_user" &&
      user !== undefined &&
      assignmentId !== null;

    const id = this.deps.ids.unguessable("verification", now.getTime());
    const code = generateCode();
    const expiresAt = new Date(now.getTime() + CODE_TTL_SEC * 1000);
    const subject = `${product.id}\0${canonicalLicenseKey(body.license_key) ?? body.license_key}\0${email.normalized}`;
    const addressHash = mailboxHash(this.deps.secrets, email.normalized);
    const row: VerificationRow = {
      id,
      environment: product.environment,
      productId: product.id,
      subjectHash: this.deps.secrets.lookupHash(subject, "email-verification-subject"),
      // Filled in below once the send limits have answered.
      licenseId: null,
      userId: null,
      assignmentId: null,
      deviceThumbprint: thumbprint(deviceKey.text),
      codeHash: hashCode(this.deps.secrets, id, code),
      attempts: 0,
      codeFailures: 0,
      addressHash,
      sent: false,
      counted: false,
      expiresAt,
      closedAt: null,
      closedReason: null,
      createdAt: now,
      latestStartAt: null,
    };
    this.deps.db.transaction(
      (tx) => {
        // Asked whether or not the address matched, inside the immediate transaction so parallel
        // starts cannot overrun it.
        const { counted, mailboxOpen } = this.limits.check(row.subjectHash, addressHash, now);
        const send = matched && counted && mailboxOpen;
        row.counted = counted;
        if (send)
          Object.assign(row, {
            licenseId: license.id,
            userId: user.id,
            assignmentId,
            sent: true,
          });
        // Spec §3.2 rule 3: a newer start for the same product, license key and address replaces
        // the older; one the subject's limit holds back does not, or anyone with the license key
        // could keep cancelling a user's sign-in. Held back, it still writes one open
        // verification: the newest held back before it (closed: it could never confirm), else the
        // counted one (left open, stamped), whether or not that one mailed a code: an unknown
        // address keeps its counted verification open as a user keeps theirs, so confirming it
        // answers alike (a wrong code, not an expired verification). So each start writes one row
        // however often the address is probed, and the stamp makes the write real (SQLite skips a
        // row rewritten unchanged, and the page that saved made held-back starts measurably
        // faster). The row is looked up by every start in a statement of its own: inside the
        // UPDATE, SQLite tests the cheap `replace = 1` first and skipped the lookup for the starts
        // that may send.
        const replace = counted ? 1 : 0;
        const newestOpen =
          tx
            .select({ id: emailVerifications.id })
            .from(emailVerifications)
            .where(
              and(eq(emailVerifications.subjectHash, row.subjectHash), isNull(emailVerifications.closedAt)),
            )
            .orderBy(
              asc(emailVerifications.counted),
              desc(emailVerifications.createdAt),
              desc(emailVerifications.id),
            )
            .limit(1)
            .get()?.id ?? "";
        const closes = sql`(${replace} = 1 OR counted = 0)`;
        tx.update(emailVerifications)
          .set({
            closedAt: sql`CASE WHEN ${closes} THEN ${now.getTime()} ELSE closed_at END`,
            closedReason: sql`CASE WHEN ${closes} THEN 'replaced' ELSE closed_reason END`,
            latestStartAt: now,
          })
          .where(
            and(
              eq(emailVerifications.subjectHash, row.subjectHash),
              isNull(emailVerifications.closedAt),
              sql`(${replace} = 1 OR id = ${newestOpen})`,
            ),
          )
          .run();
        tx.insert(emailVerifications).values(row).run();
        const approvalSecret = this.passkeys.approvals.newApproval(tx, id);
        this.mail.enqueue(
          tx,
          {
            // The address as the vendor stored it: the match ignored case, a mailbox may not.
            to: send ? user.email : email.address,
            template: "email_verification_code",
            locale: body.locale,
            data: {
              code,
              product_name: product.name,
              expires_minutes: String(CODE_TTL_SEC / 60),
              ...(withPasskeys
                ? { approval_url: this.passkeys.approvals.approvalUrl(id, approvalSecret) }
                : {}),
            },
          },
          { suppressed: !send },
        );
      },
      { behavior: "immediate" },
    );
    return {
      data: {
        verification_id: id,
        expires_at: expiresAt.toISOString(),
        resend_after_sec: RESEND_AFTER_SEC,
        code_length: CODE_LENGTH,
      },
      productId: product.id,
    };
  }

  /**
   * Every write (the attempt, the second-factor step or failure, the lock, the use) commits, and
   * only then is a refusal thrown: a wrong guess is never rolled back.
   */
  confirm(verificationId: string, body: EmailVerificationConfirmBody) {
    const outcome = this.deps.db.transaction((tx) => this.decide(tx, verificationId, body), {
      behavior: "immediate",
    });
    if (outcome instanceof ApiError) throw outcome;
    return outcome;
  }

  private decide(tx: Writer, verificationId: string, body: EmailVerificationConfirmBody) {
    const now = this.deps.clock.now();
    const row = tx.select().from(emailVerifications).where(eq(emailVerifications.id, verificationId)).get();
    if (!row) return expired();
    // Past the subject's wrong-code budget nothing is compared or counted: the answer cannot tell
    // a right guess from a wrong one. Asked for every verification, with or without a user, so the
    // budget running out cannot tell them apart either.
    if (!this.limits.withinFailureBudget(row.subjectHash, now)) return expired();
    const deviceMismatch = row.deviceThumbprint !== thumbprint(body.device_signing_public_key);
    const check = checkCode(this.deps.secrets, row, body.code, now, row.licenseId === null || deviceMismatch);
    if (check.outcome === "expired") return expired();
    const setAttempts = (attempts: number) =>
      tx.update(emailVerifications).set({ attempts }).where(eq(emailVerifications.id, row.id)).run();
    setAttempts(check.attempts);
    if (check.outcome === "invalid") {
      tx.update(emailVerifications)
        .set({ codeFailures: row.codeFailures + 1 })
        .where(eq(emailVerifications.id, row.id))
        .run();
      return new ApiError("EMAIL_VERIFICATION_CODE_INVALID", "The code, address or device key is wrong.", {
        remaining_attempts: check.remainingAttempts,
      });
    }
    if (!hasFeature(this.plan(), FEATURE)) return planLacksFeature();
    const state = currentSignInState(this.deps.secrets, tx, row, now);
    if (!state) return assignmentUnavailable();
    const { user } = state;
    if (this.twoFactor.required(user)) {
      if (user.twoFactorLockedAt !== null) {
        return new ApiError(
          "TWO_FACTOR_LOCKED",
          "Two-factor is locked for this user; the vendor must unlock it.",
        );
      }
      if (!body.second_factor_code) {
        // Not a mistake (spec §3.2): the attempt is given back and the code stays valid.
        setAttempts(check.attempts - 1);
        return new ApiError("TWO_FACTOR_REQUIRED", "This user has two-factor: send second_factor_code.", {
          remaining_attempts: check.remainingAttempts + 1,
        });
      }
      if (this.twoFactor.verify(tx, user, body.second_factor_code, row.id) !== "accepted") {
        return new ApiError("TWO_FACTOR_INVALID", "The second factor is wrong.", {
          remaining_attempts: check.remainingAttempts,
        });
      }
    }
    tx.update(emailVerifications)
      .set({ closedAt: now, closedReason: "used" })
      .where(eq(emailVerifications.id, row.id))
      .run();
    const token = newNamedUserToken();
    const expiresAt = new Date(now.getTime() + NAMED_USER_TOKEN_TTL_SEC * 1000);
    tx.insert(namedUserTokens)
      .values({
        tokenHash: namedUserTokenHash(this.deps.secrets, token),
        verificationId: row.id,
        licenseId: state.licenseId,
        userId: user.id,
        assignmentId: state.assignmentId,
        deviceThumbprint: row.deviceThumbprint,
        expiresAt,
        usedAt: null,
      })
      .run();
    return {
      data: { named_user_token: token, expires_at: expiresAt.toISOString() },
      productId: row.productId,
    };
  }

  /** The sweeper's purge of old verifications, their approvals and tokens (purge.ts). */
  purge(batch?: number, stopped?: () => boolean): Promise<number> {
    return purgeEmailVerifications(this.deps, batch, stopped);
  }
}

const expired = () =>
  new ApiError(
    "EMAIL_VERIFICATION_EXPIRED",
    "The verification expired, was used or replaced, or ran out of attempts.",
  );
