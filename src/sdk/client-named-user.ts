/**
 * Email verification for named-user licenses: start (the service mails a six-digit code to the
 * user), confirm (the code and, for users with two-factor, a second factor), then activate() with
 * the returned token. Every answer passes the full verification chain.
 */
import { readVerificationStart, TrialCapableClient, type VerificationStart } from "./client-trial.ts";
import { invalidResponse } from "./core.ts";
import { usageError } from "./errors.ts";
import { newNonce } from "./proof.ts";
import { isNonEmptyString, isRecord, isString } from "./util.ts";

export interface StartEmailVerificationOptions {
  licenseKey: string;
  email: string;
  /** BCP 47 tag for the mail (e.g. "de-AT"); the service falls back to English. */
  locale?: string;
}

export type EmailVerification = VerificationStart;

export interface ConfirmEmailVerificationOptions {
  verificationId: string;
  code: string;
  /** An authenticator code or a recovery code, for users with two-factor. */
  secondFactorCode?: string;
}

export interface NamedUserToken {
  /** Pass as `namedUserToken` to activate(), from this device, within `expiresAt`, once. */
  namedUserToken: string;
  expiresAt: string;
}

const EMAIL = /^[^\s@]+@[^\s@]+$/;

export class NamedUserCapableClient extends TrialCapableClient {
  /**
   * POST /runtime/v1/email-verifications. The answer is the same whether or not a code was sent
   * (unknown address, no assignment, inactive license), so a missing mail is not an error here.
   * Generates device keys on first use: the confirm and the activation must use the same keys.
   */
  startEmailVerification(options: StartEmailVerificationOptions): Promise<EmailVerification> {
    return this.exclusive(async () => {
      if (!isNonEmptyString(options.licenseKey))
        throw usageError("INVALID_ARGUMENT", "licenseKey is required");
      if (!isString(options.email) || !EMAIL.test(options.email.trim()))
        throw usageError("INVALID_ARGUMENT", "email must be an address");
      if (options.locale !== undefined && !isNonEmptyString(options.locale))
        throw usageError("INVALID_ARGUMENT", "locale must be a language tag");
      const keys = await this.deviceKeys();
      const nonce = newNonce();
      const res = await this.runtime.call({
        method: "POST",
        path: "/runtime/v1/email-verifications",
        body: {
          product_id: this.config.productId,
          license_key: options.licenseKey.trim(),
          email: options.email.trim(),
          device_signing_public_key: keys.signing.publicKey,
          nonce,
          sdk_version: this.sdkVersion,
          ...(options.locale === undefined ? {} : { locale: options.locale }),
        },
        nonce,
      });
      return readVerificationStart(res, "email verification");
    });
  }

  /**
   * POST /runtime/v1/email-verifications/{id}/confirm. Refusals are thrown as SdkError of kind
   * "server": EMAIL_VERIFICATION_CODE_INVALID, TWO_FACTOR_REQUIRED (ask for the second factor and
   * confirm again with the same code), TWO_FACTOR_INVALID (`details.remaining_attempts`),
   * TWO_FACTOR_LOCKED, NAMED_USER_ASSIGNMENT_UNAVAILABLE, EMAIL_VERIFICATION_EXPIRED.
   */
  confirmEmailVerification(options: ConfirmEmailVerificationOptions): Promise<NamedUserToken> {
    return this.exclusive(async () => {
      if (!isNonEmptyString(options.verificationId))
        throw usageError("INVALID_ARGUMENT", "verificationId is required");
      if (!isString(options.code) || !/^[0-9]{6}$/.test(options.code.trim()))
        throw usageError("INVALID_ARGUMENT", "code must be six digits");
      if (options.secondFactorCode !== undefined && !isNonEmptyString(options.secondFactorCode))
        throw usageError("INVALID_ARGUMENT", "secondFactorCode must be a string");
      const keys = await this.deviceKeys();
      const nonce = newNonce();
      const res = await this.runtime.call({
        method: "POST",
        path: `/runtime/v1/email-verifications/${encodeURIComponent(options.verificationId)}/confirm`,
        body: {
          code: options.code.trim(),
          device_signing_public_key: keys.signing.publicKey,
          nonce,
          sdk_version: this.sdkVersion,
          ...(options.secondFactorCode === undefined
            ? {}
            : { second_factor_code: options.secondFactorCode.trim() }),
        },
        nonce,
      });
      const data = res.data;
      if (!isRecord(data) || !isNonEmptyString(data.named_user_token) || !isNonEmptyString(data.expires_at))
        throw invalidResponse("email verification confirm malformed");
      return { namedUserToken: data.named_user_token, expiresAt: data.expires_at };
    });
  }
}
