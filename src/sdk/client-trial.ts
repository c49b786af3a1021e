/**
 * Trial sign-up for LicensingClient: start (the service mails a six-digit code) and confirm (the
 * code, the address and a Service-Trial-Proof-v1 device proof), which leaves the device activated
 * on a trial license exactly as activate() does. Every answer passes the full verification chain.
 */
import { OfflineCapableClient } from "./client-offline.ts";
import { type ActivationResult, checkMachineInfo, invalidResponse, machineInfoDigest } from "./core.ts";
import { usageError } from "./errors.ts";
import { thumbprint } from "./keys.ts";
import { newIdempotencyKey, newNonce, signTrialProof } from "./proof.ts";
import type { RuntimeResponse } from "./runtime.ts";
import type { MachineInfo } from "./state.ts";
import { isInt, isNonEmptyString, isRecord, isString } from "./util.ts";

export interface StartTrialOptions {
  email: string;
  /** BCP 47 tag for the mail (e.g. "de-AT"); the service falls back to English. */
  locale?: string;
}

/** The 202 of a verification start, trial or email (both answer this shape). */
export interface VerificationStart {
  verificationId: string;
  /** ISO 8601: when the code stops working (10 minutes after the start). */
  expiresAt: string;
  /** Do not start again for this address before this many seconds: keep confirming this one. */
  resendAfterSec: number;
  codeLength: number;
}

export type TrialVerification = VerificationStart;

/** Reads a verification start's answer; anything but a well-formed 202 is an invalid response. */
export function readVerificationStart(res: RuntimeResponse, what: string): VerificationStart {
  const data = res.data;
  if (
    res.status !== 202 ||
    !isRecord(data) ||
    !isNonEmptyString(data.verification_id) ||
    !isNonEmptyString(data.expires_at) ||
    !isInt(data.resend_after_sec) ||
    !isInt(data.code_length)
  ) {
    throw invalidResponse(`${what} start malformed`);
  }
  return {
    verificationId: data.verification_id,
    expiresAt: data.expires_at,
    resendAfterSec: data.resend_after_sec,
    codeLength: data.code_length,
  };
}

export interface ConfirmTrialOptions {
  verificationId: string;
  code: string;
  /** The address given to startTrial. */
  email: string;
  machineInfo: MachineInfo;
  machineSignals?: Record<string, string>;
}

const EMAIL = /^[^\s@]+@[^\s@]+$/;

export class TrialCapableClient extends OfflineCapableClient {
  /**
   * POST /runtime/v1/trial-verifications. The answer is the same whether or not a code was sent
   * (the product may not accept sign-ups, or a send limit applies), so a missing mail is not an
   * error here. Generates device keys on first use: the confirm must come from the same keys.
   */
  startTrial(options: StartTrialOptions): Promise<TrialVerification> {
    return this.exclusive(async () => {
      if (!isString(options.email) || !EMAIL.test(options.email.trim()))
        throw usageError("INVALID_ARGUMENT", "email must be an address");
      if (options.locale !== undefined && !isNonEmptyString(options.locale))
        throw usageError("INVALID_ARGUMENT", "locale must be a language tag");
      const keys = await this.deviceKeys();
      const nonce = newNonce();
      const res = await this.runtime.call({
        method: "POST",
        path: "/runtime/v1/trial-verifications",
        body: {
          product_id: this.config.productId,
          email: options.email.trim(),
          device_signing_public_key: keys.signing.publicKey,
          nonce,
          sdk_version: this.sdkVersion,
          ...(options.locale === undefined ? {} : { locale: options.locale }),
        },
        nonce,
      });
      return readVerificationStart(res, "trial verification");
    });
  }

  /**
   * POST /runtime/v1/trial-verifications/{id}/confirm. On success the device is activated on the
   * trial license (licenseState(), heartbeat() and the rest work as after activate()). Server
   * refusals (wrong code with `details.remaining_attempts`, TRIAL_ALREADY_USED, ...) are thrown
   * as SdkError of kind "server".
   */
  confirmTrial(options: ConfirmTrialOptions): Promise<ActivationResult> {
    return this.exclusive(async () => {
      if (!isNonEmptyString(options.verificationId))
        throw usageError("INVALID_ARGUMENT", "verificationId is required");
      if (!isNonEmptyString(options.code)) throw usageError("INVALID_ARGUMENT", "code is required");
      if (!isString(options.email) || !EMAIL.test(options.email.trim()))
        throw usageError("INVALID_ARGUMENT", "email must be an address");
      const machineInfo = checkMachineInfo(options.machineInfo);
      const signals = options.machineSignals ?? {};
      if (!isRecord(signals) || !Object.values(signals).every(isString)) {
        throw usageError("INVALID_ARGUMENT", "machineSignals must map strings to strings");
      }
      if (await this.storedActivation())
        throw usageError("ALREADY_ACTIVATED", "this device is already activated");
      const keys = await this.deviceKeys();
      const digest = machineInfoDigest(machineInfo);
      // One key for the whole call: a retry after a clock-skew answer is the same request.
      const idempotencyKey = newIdempotencyKey();
      const path = `/runtime/v1/trial-verifications/${encodeURIComponent(options.verificationId)}/confirm`;

      // Not made again when another client replaced the device keys meanwhile, as activate() is:
      // the code is spent, and the verification is bound to the keys that started it
      // (DEVICE_KEYS_CHANGED, not retryable: start again).
      let res: RuntimeResponse;
      try {
        res = await this.withClockSkewRetry(() => {
          const nonce = newNonce();
          const body: Record<string, unknown> = {
            code: options.code.trim(),
            email: options.email.trim(),
            ...this.deviceFields(keys, machineInfo, signals, nonce),
          };
          body.device_proof = signTrialProof(keys, body);
          const denialSubject = { device_thumbprint: thumbprint(keys.signing.publicKey) };
          return this.runtime.call({ method: "POST", path, body, nonce, idempotencyKey, denialSubject });
        });
      } catch (error) {
        throw await this.recordActivationRefusal(error);
      }

      const data = res.data;
      if (!isRecord(data) || !isNonEmptyString(data.activation_id) || !isNonEmptyString(data.license_id))
        throw invalidResponse("trial confirmation data malformed");
      return this.acceptActivation(res, data, data.activation_id, keys, machineInfo, digest, data.license_id);
    });
  }
}
