/**
 * One runtime API call, end to end: build the request (JCS body, device-proof headers), send it,
 * and accept the answer only after the full verification chain (trust bundle, delegation,
 * response signature, nonce, status, product, body hash). Unsigned errors become SdkError of
 * kind "server"; signed license-state denials become kind "license".
 */
import type { ResolvedConfig } from "./config.ts";
import { utf8 } from "./encoding.ts";
import { isLicenseDenialCode, SdkError } from "./errors.ts";
import { type FetchLike, type HttpResult, readErrorEnvelope, send, serverError } from "./http.ts";
import { canonicalize } from "./jcs.ts";
import type { DeviceKeys } from "./keys.ts";
import { deviceProofHeaders } from "./proof.ts";
import type { TrustManager } from "./trust.ts";
import {
  hasSignatureFields,
  type ResponseAssertion,
  type TrustBundle,
  type VerifiedEnvelope,
  verifyEnvelope,
} from "./verify.ts";

export interface RuntimeRequest {
  method: "GET" | "POST" | "DELETE";
  /** Path below api_url, e.g. "/runtime/v1/time". */
  path: string;
  body?: Record<string, unknown>;
  /** The nonce the response must echo (body nonce, or the X-Service-Nonce below). */
  nonce: string;
  idempotencyKey?: string;
  /** Present on DP operations: signs the request with the device key. */
  deviceProof?: { keys: DeviceKeys; activationId: string; timestamp: number };
  /**
   * Whom a signed denial must name in its signed `error.details` (protocol §16): by default, on
   * DP operations, `{ activation_id }` of the proof. The nonce alone does not bind a denial to
   * this device: another activation of the product can have the same nonce signed on its own.
   */
  denialSubject?: DenialSubject;
}

export type DenialSubject = { activation_id: string } | { device_thumbprint: string };

export interface RuntimeResponse {
  status: number;
  data: unknown;
  assertion: ResponseAssertion;
  bundle: TrustBundle;
}

/**
 * How long an answer may take to come back and still tell the server's time now. One on its way
 * longer may have been held back (to wind the device's time marks back by as long): it only
 * raises them. Thirty seconds is far beyond a round trip, and far inside the 300 s a clock check
 * allows.
 */
export const FRESH_ANSWER_MS = 30_000;

/**
 * Called with every verified assertion (success or denial), before anything else happens.
 * `fresh`: no other verified answer arrived while this one's request was in flight, and it came
 * back within FRESH_ANSWER_MS; otherwise it may have been held back on its way and is not the
 * newest word on the server's time.
 */
export type AssertionObserver = (
  assertion: ResponseAssertion,
  receivedAtMs: number,
  fresh: boolean,
) => Promise<void>;

/** What a request noted when it was sent, to tell whether its answer is fresh. */
interface Sent {
  answers: number;
  monotonicMs: number;
}

export class Runtime {
  constructor(
    private readonly config: ResolvedConfig,
    private readonly fetchImpl: FetchLike,
    private readonly trust: TrustManager,
    private readonly now: () => number,
    private readonly onVerified: AssertionObserver,
    /** A clock nobody sets (the local one may be put back while an answer is held). */
    private readonly monotonicNow: () => number,
  ) {}

  /** Verified answers so far: a request notes the count when sent, to tell if one overtook it. */
  private answers = 0;

  async call(req: RuntimeRequest): Promise<RuntimeResponse> {
    // Before sending, not only when verifying: a bundle past its confirmation bound that cannot be
    // refetched refuses the answer (BUNDLE_UNCONFIRMED), and the service must not have acted on a
    // request (a check-in, a deactivation, a seat) whose answer the device will refuse.
    await this.trust.forAnswer();
    const sent: Sent = { answers: this.answers, monotonicMs: this.monotonicNow() };
    const url = new URL(this.config.apiBase + req.path);
    const bodyText = req.body === undefined ? undefined : canonicalize(req.body);
    const headers: Record<string, string> = { accept: "application/json" };
    if (bodyText !== undefined) headers["content-type"] = "application/json";
    if (req.idempotencyKey !== undefined) headers["Idempotency-Key"] = req.idempotencyKey;
    if (req.deviceProof) {
      Object.assign(
        headers,
        deviceProofHeaders(req.deviceProof.keys, {
          method: req.method,
          pathAndQuery: url.pathname + url.search,
          activationId: req.deviceProof.activationId,
          timestamp: req.deviceProof.timestamp,
          nonce: req.nonce,
          body: utf8(bodyText ?? ""),
        }),
      );
    }
    const res = await send(this.fetchImpl, url.href, {
      method: req.method,
      headers,
      ...(bodyText === undefined ? {} : { body: bodyText }),
    });
    if (res.status >= 200 && res.status < 300) {
      if (res.malformed || res.body === undefined) {
        throw new SdkError("RESPONSE_INVALID", "response body is not JSON", {
          kind: "verification",
          status: res.status,
        });
      }
      const verified = await this.verify(res, req.nonce, "data", sent);
      return { status: res.status, data: verified.envelope.payload, ...verified.rest };
    }
    const subject =
      req.denialSubject ?? (req.deviceProof ? { activation_id: req.deviceProof.activationId } : undefined);
    throw await this.errorFor(res, req.nonce, sent, subject);
  }

  private async errorFor(
    res: HttpResult,
    nonce: string,
    sent: Sent,
    subject?: DenialSubject,
  ): Promise<SdkError> {
    const envelope = readErrorEnvelope(res.body);
    if (envelope && hasSignatureFields(res.body)) {
      const { envelope: verified } = await this.verify(res, nonce, "error", sent);
      const signedError = readErrorEnvelope({ error: verified.payload }) ?? envelope;
      for (const [field, expected] of Object.entries(subject ?? {})) {
        // Authentic, but possibly another device's denial answered with our nonce: act on none.
        if (signedError.details[field] !== expected) {
          throw new SdkError("ACTIVATION_MISMATCH", `signed ${signedError.code} names another ${field}`, {
            kind: "verification",
            status: res.status,
            requestId: signedError.request_id,
            details: { server_code: signedError.code, field, received: signedError.details[field] ?? null },
          });
        }
      }
      const kind = isLicenseDenialCode(signedError.code) ? "license" : "server";
      return new SdkError(signedError.code, signedError.message || signedError.code, {
        kind,
        status: res.status,
        retryable: signedError.retryable,
        requestId: signedError.request_id,
        serverError: signedError,
        details: { ...signedError.details, signed: true, server_time: verified.assertion.server_time },
      });
    }
    if (envelope && isLicenseDenialCode(envelope.code)) {
      // A license-state denial must be signed; an unsigned one is never taken as license state.
      return new SdkError("RESPONSE_UNSIGNED", `unsigned ${envelope.code} response refused`, {
        kind: "verification",
        status: res.status,
        requestId: envelope.request_id,
        details: { server_code: envelope.code },
      });
    }
    return serverError(res, this.now());
  }

  private async verify(
    res: HttpResult,
    nonce: string,
    payloadField: "data" | "error",
    sent: Sent,
  ): Promise<{ envelope: VerifiedEnvelope; rest: { assertion: ResponseAssertion; bundle: TrustBundle } }> {
    const receivedAtMs = this.now();
    const onItsWayMs = this.monotonicNow() - sent.monotonicMs;
    // Only with a bundle the service confirmed lately (trust.ts forAnswer): a device whose
    // refetches fail must not go on taking answers signed under a key compromised since.
    let bundle = await this.trust.forAnswer();
    let envelope: VerifiedEnvelope;
    const opts = { productId: this.config.productId, nonce, status: res.status, payloadField };
    try {
      envelope = verifyEnvelope(res.body, { ...opts, bundle });
    } catch (error) {
      // A signing key we do not know yet: the bundle may have rotated. Refetch once and retry.
      if (!(error instanceof SdkError && error.code === "KEY_UNKNOWN")) throw error;
      try {
        bundle = await this.trust.refresh();
      } catch (refreshError) {
        const offline = refreshError instanceof SdkError && refreshError.kind !== "verification";
        throw offline ? error : refreshError;
      }
      envelope = verifyEnvelope(res.body, { ...opts, bundle });
    }
    const fresh = this.answers === sent.answers && onItsWayMs <= FRESH_ANSWER_MS;
    this.answers++;
    await this.onVerified(envelope.assertion, receivedAtMs, fresh);
    return { envelope, rest: { assertion: envelope.assertion, bundle } };
  }
}
