import { eq } from "drizzle-orm";
import { constantTimeEqual } from "../../crypto/constant-time.ts";
import { PREFIX } from "../../crypto/envelope.ts";
import { type PublicKeyInfo, parsePublicKey, thumbprint } from "../../crypto/keys.ts";
import type { ChangeContext, Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import type { EmailAddress } from "../../domain/email-address.ts";
import {
  CODE_LENGTH,
  CODE_TTL_SEC,
  checkCode,
  generateCode,
  hashCode,
} from "../../domain/verification-code.ts";
import { verifyBodyProof } from "../../http/device-proof.ts";
import { emailField } from "../../http/email-field.ts";
import { ApiError, type SignedFor } from "../../http/errors.ts";
import type { IdempotencyStore, Outcome } from "../../http/idempotency.ts";
import type { MailOutbox } from "../../mail/outbox.ts";
import {
  activations,
  licenses,
  products,
  trialGrants,
  trialVerifications,
} from "../../store/schema/index.ts";
import type { RuntimeCall, RuntimeGate, SignedResult, Target } from "../activations/gate.ts";
import type { ActivationService } from "../activations/service.ts";
import type { LicenseService } from "../licenses/service.ts";
import type { ProductRow } from "../products/service.ts";
import { planLacksTrials, type TrialSignupService } from "../products/trial-signup-service.ts";
import type { TrustService } from "../trust/service.ts";
import { enqueueEvent } from "../webhooks/enqueue.ts";
import { activeTrialOf, hadTrial } from "./grants.ts";
import type { TrialConfirmBody, TrialStartBody } from "./model.ts";
import { purgeTrialVerifications } from "./purge.ts";
import { SEND_LIMITS, SendLimits } from "./send-limits.ts";

const CONFIRM_ROUTE = "/runtime/v1/trial-verifications/:id/confirm";

interface StartResult {
  verification_id: string;
  expires_at: string;
  resend_after_sec: number;
  code_length: number;
}

const expired = () =>
  new ApiError(
    "EMAIL_VERIFICATION_EXPIRED",
    "This verification is expired, used, out of attempts or unknown; start again.",
  );

/** Compared whatever else refuses the attempt, so a silent start takes the same time to refuse. */
const addressMismatch = (stored: string, sent: string): boolean => !constantTimeEqual(stored, sent);

const activationInvalid = (reason: string) =>
  new ApiError("TRIAL_ACTIVATION_INVALID", "The product does not accept trial sign-ups now.", { reason });

/**
 * Trial sign-up by email code (spec §3.2, §4.2 rules 9-12): the start sends a code only when the
 * product accepts sign-ups and the send limits allow, and answers the same either way; the
 * confirm checks the code, then issues a trial license (or joins the address's active trial) and
 * activates the device on it.
 */
export class TrialVerificationService {
  private readonly limits: SendLimits;

  constructor(
    private readonly deps: Deps,
    private readonly signups: TrialSignupService,
    private readonly licenses: LicenseService,
    private readonly activations: ActivationService,
    private readonly gate: RuntimeGate,
    private readonly idempotency: IdempotencyStore,
    private readonly trust: TrustService,
    private readonly mail: MailOutbox,
  ) {
    this.limits = new SendLimits(deps.sqlite);
  }

  /**
   * Start: the same work and the same answer whether or not a code goes out. Every start makes a
   * verification with a fresh code; only a start that may send mails that code, in the same
   * transaction, so the limits cannot be overrun by parallel requests.
   */
  start(body: TrialStartBody): SignedResult<StartResult> {
    const product = this.product(body.product_id);
    if (!parsePublicKey(body.device_signing_public_key)) {
      throw ApiError.validation({
        device_signing_public_key: ["must be ed25519:<b64u 32 bytes> or p256:<b64u 65-byte point>"],
      });
    }
    if (product.signingStatus !== "ready") this.trust.signingKey(product.id);
    const email = emailField(body.email);
    const emailLookup = this.emailLookup(email);
    const deviceThumbprint = thumbprint(body.device_signing_public_key);
    const data = this.deps.db.transaction(
      (tx) => {
        const now = this.deps.clock.now();
        const accepting = this.signups.state(product, now, tx).status === "accepting";
        // Counted even when the product refuses sign-ups: a start that cannot send must not be
        // measurably cheaper than one that may (test/api/trial-start-work.test.ts).
        const allowed = this.limits.allow(emailLookup, product.id, now);
        const send = accepting && allowed;
        const id = this.deps.ids.unguessable("verification", now.getTime());
        const code = generateCode();
        const expiresAt = new Date(now.getTime() + CODE_TTL_SEC * 1000);
        tx.insert(trialVerifications)
          .values({
            id,
            environment: product.environment,
            productId: product.id,
            emailLookup,
            deviceThumbprint,
            codeHash: hashCode(this.deps.secrets, id, code),
            attempts: 0,
            sent: send,
            status: "started",
            createdAt: now,
            expiresAt,
            usedAt: null,
          })
          .run();
        // A silent start writes the same row, suppressed (never sent), as email verification does:
        // without it the outbox insert alone made a sending start 0.1 ms slower, which the
        // timing bench (test/bench/verification-timing.ts) tells apart.
        this.mail.enqueue(
          tx,
          {
            // The parsed address, never the text as given: limits and mailer see one mailbox.
            to: email.address,
            template: "trial_verification_code",
            locale: body.locale,
            data: { code, product_name: product.name, expires_minutes: String(CODE_TTL_SEC / 60) },
          },
          { suppressed: !send },
        );
        return {
          verification_id: id,
          expires_at: expiresAt.toISOString(),
          resend_after_sec: SEND_LIMITS.sameAddressGapSec,
          code_length: CODE_LENGTH,
        };
      },
      { behavior: "immediate" },
    );
    return { data, productId: product.id, nonce: body.nonce };
  }

  /** The sweeper's purge of old verifications (purge.ts). */
  purgeVerifications(batch?: number, stopped?: () => boolean): Promise<number> {
    return purgeTrialVerifications(this.deps, batch, stopped);
  }

  /**
   * Confirm: the proof and clock first (before idempotency, as for activation create), then the
   * code in a transaction of its own so a wrong guess stays counted, then the issue inside the
   * idempotency transaction, so a failure there leaves no license and no used verification.
   */
  confirm(
    verificationId: string,
    body: TrialConfirmBody,
    idempotencyKey: string | undefined,
    call: RuntimeCall,
  ): Promise<{ outcome: Outcome; productId: string }> {
    const target: Target = {};
    return this.gate.observe("activation_create", target, call, () => {
      const verification = this.deps.db
        .select()
        .from(trialVerifications)
        .where(eq(trialVerifications.id, verificationId))
        .get();
      if (!verification) throw expired();
      Object.assign(target, { environment: verification.environment, productId: verification.productId });
      const deviceKey = this.verifyProof(body);
      const deviceThumbprint = thumbprint(deviceKey.text);
      const emailLookup = this.emailLookup(emailField(body.email));
      // A used verification goes straight to idempotency: the same request again is a replay.
      if (verification.status === "started") {
        this.checkCode(verification.id, body.code, emailLookup);
        if (deviceThumbprint !== verification.deviceThumbprint) {
          throw new ApiError(
            "DEVICE_KEY_MISMATCH",
            "This verification was started with another device signing key.",
          );
        }
      }
      const outcome = this.idempotency.execute(
        {
          scope: `device:${deviceThumbprint}`,
          method: "POST",
          route: CONFIRM_ROUTE,
          key: idempotencyKey,
          body: { verification_id: verificationId, ...trialIdempotentPartOf(body) },
          required: true,
        },
        () => ({
          status: 201,
          body: this.issue(verificationId, body, deviceKey, emailLookup, call, target),
        }),
      );
      if (outcome.replayed) this.recheckReplay(outcome, deviceThumbprint, body.nonce, verification.productId);
      return { outcome, productId: verification.productId };
    });
  }

  private product(id: string): ProductRow {
    const product = this.deps.db.select().from(products).where(eq(products.id, id)).get();
    if (!product) throw ApiError.notFound("product");
    return product;
  }

  private emailLookup(email: EmailAddress): string {
    return this.deps.secrets.lookupHash(email.normalized, "trial-email");
  }

  /** Both device keys, the clock, and the trial proof over the body (its own prefix, never the activation one). */
  private verifyProof(body: TrialConfirmBody): PublicKeyInfo {
    return verifyBodyProof(body, PREFIX.trialProof, unixSeconds(this.deps.clock.now()));
  }

  /** One attempt, counted and committed before the answer whatever it is. */
  private checkCode(id: string, code: string, emailLookup: string): void {
    const result = this.deps.db.transaction(
      (tx) => {
        const now = this.deps.clock.now();
        const row = tx.select().from(trialVerifications).where(eq(trialVerifications.id, id)).get();
        if (!row) return { outcome: "expired" as const };
        const check = checkCode(
          this.deps.secrets,
          {
            id: row.id,
            codeHash: row.codeHash,
            attempts: row.attempts,
            expiresAt: row.expiresAt,
            closedAt: row.status === "used" ? (row.usedAt ?? now) : null,
          },
          code,
          now,
          // A silent start's code was never mailed (protocol.md: "no code matches it"); without
          // this, silent starts for someone else's address would be five guesses each. The answer
          // hides which of code, address or silence refused it; so must the timing.
          addressMismatch(row.emailLookup, emailLookup) || !row.sent,
        );
        if (check.outcome !== "expired") {
          tx.update(trialVerifications)
            .set({ attempts: check.attempts })
            .where(eq(trialVerifications.id, id))
            .run();
        }
        return check;
      },
      { behavior: "immediate" },
    );
    if (result.outcome === "expired") throw expired();
    if (result.outcome === "invalid") {
      throw new ApiError("EMAIL_VERIFICATION_CODE_INVALID", "The code or the address is wrong.", {
        remaining_attempts: result.remainingAttempts,
      });
    }
  }

  /** Runs inside the idempotency transaction: any refusal rolls all of it back. */
  private issue(
    verificationId: string,
    body: TrialConfirmBody,
    deviceKey: PublicKeyInfo,
    emailLookup: string,
    call: RuntimeCall,
    target: Target,
  ) {
    const now = this.deps.clock.now();
    const db = this.deps.db;
    const verification = db
      .select()
      .from(trialVerifications)
      .where(eq(trialVerifications.id, verificationId))
      .get();
    if (verification?.status !== "started" || now.getTime() >= verification.expiresAt.getTime())
      throw expired();
    db.update(trialVerifications)
      .set({ status: "used", usedAt: now })
      .where(eq(trialVerifications.id, verificationId))
      .run();
    const product = this.product(verification.productId);
    const deviceThumbprint = thumbprint(deviceKey.text);
    const state = this.signups.state(product, now);
    if (state.status === "not_entitled") throw planLacksTrials();
    let license = activeTrialOf(this.deps.db, product.id, emailLookup, now);
    const kind = license ? "joined" : "started";
    const ctx: ChangeContext = {
      actor: { type: "device", id: deviceThumbprint },
      environment: product.environment,
      requestId: call.requestId,
    };
    if (license) {
      // Joining adds a device to a trial that exists; the 24-hour limit counts new trials only.
      if (state.status !== "accepting" && state.status !== "limit_reached")
        throw activationInvalid(state.status);
    } else {
      if (state.status !== "accepting" || !state.policy) throw activationInvalid(state.status);
      if (hadTrial(this.deps.db, product.id, emailLookup, deviceThumbprint, now)) {
        throw new ApiError(
          "TRIAL_ALREADY_USED",
          "This address or device already had a trial of this product in the last 365 days.",
        );
      }
      license = this.licenses.create(
        {
          product_id: product.id,
          policy_id: state.policy.id,
          metadata: { trial_signup_email: emailField(body.email).normalized },
        },
        ctx,
      );
    }
    target.licenseId = license.id;
    const activation = this.activations.activate(
      {
        license_key: "",
        product_id: product.id,
        device_signing_public_key: body.device_signing_public_key,
        device_kem_public_key: body.device_kem_public_key,
        device_proof: body.device_proof,
        machine_info: body.machine_info,
        machine_signals: body.machine_signals,
        app_version: body.app_version,
        sdk_version: body.sdk_version,
        request_id: body.request_id,
        client_time: body.client_time,
        nonce: body.nonce,
      },
      deviceKey,
      target,
      license,
    );
    db.insert(trialGrants)
      .values({
        id: `trg_${this.deps.ids.ulid(now.getTime())}`,
        environment: product.environment,
        productId: product.id,
        licenseId: license.id,
        kind,
        emailLookup,
        deviceThumbprint,
        verificationId,
        createdAt: now,
      })
      .run();
    if (kind === "started") {
      // license.created is in the audit log (and goes to webhooks from there); this is the sign-up itself.
      enqueueEvent(this.deps, "trial.started", {
        environment: product.environment,
        target: { type: "license", id: license.id },
        actor: { type: "device" },
        requestId: call.requestId,
        data: {
          product_id: product.id,
          license_id: license.id,
          policy_id: license.policyId,
          activation_id: activation.activation_id,
          expires_at: license.expiresAt?.toISOString() ?? null,
        },
      });
    }
    return { ...activation, license_id: license.id };
  }

  /** As for activation create: a replay never outlives a revocation or a deactivation. */
  private recheckReplay(outcome: Outcome, deviceThumbprint: string, nonce: string, productId: string): void {
    const stored = outcome.value as { license_id: string; activation_id: string };
    const license = this.deps.db.select().from(licenses).where(eq(licenses.id, stored.license_id)).get();
    if (!license) throw expired();
    const signedFor: SignedFor = { productId, nonce, subject: { device_thumbprint: deviceThumbprint } };
    this.gate.deny("activate", license, null, deviceThumbprint, this.deps.clock.now(), signedFor);
    const activation = this.deps.db
      .select({ status: activations.status })
      .from(activations)
      .where(eq(activations.id, stored.activation_id))
      .get();
    if (activation?.status !== "active") {
      throw new ApiError(
        "ACTIVATION_DEACTIVATED",
        "This activation was deactivated; activate anew.",
        {},
        { signedFor },
      );
    }
  }
}

/** What idempotency compares: a retry carries a fresh nonce, proof and clock reading, and is otherwise the same. */
export function trialIdempotentPartOf(body: TrialConfirmBody) {
  const { nonce: _nonce, device_proof: _proof, client_time: _time, request_id: _request, ...rest } = body;
  return rest;
}
