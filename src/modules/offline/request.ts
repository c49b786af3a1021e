import { sha256Hex } from "../../crypto/encoding.ts";
import { PREFIX } from "../../crypto/envelope.ts";
import { canonicalize } from "../../crypto/jcs.ts";
import { type PublicKeyInfo, parsePublicKey, verifySignature } from "../../crypto/keys.ts";
import { parseDateTime } from "../../domain/datetime.ts";
import type { FieldErrorCollector } from "../../http/errors.ts";
import type { OfflineCertificateBody, OfflineRequestBody } from "./model.ts";

/** How old a device request may be: files travel to an air-gapped host by hand, so days. */
export const OFFLINE_REQUEST_MAX_AGE_SEC = 7 * 86_400;
/** How far ahead of the server a device clock may put `generated_at` (the runtime's clock window). */
export const OFFLINE_REQUEST_MAX_AHEAD_SEC = 300;

export interface VerifiedRequest {
  signingKey: PublicKeyInfo;
  kemKey: PublicKeyInfo;
  /**
   * hex SHA-256 of the string `device_proof` signs: two requests are identical when these are
   * equal. The proof itself is left out because one signed request has more than one valid proof
   * (an ECDSA signature (r, s) and (r, n - s) both verify, and any signature a device makes again
   * is a new one); counting it would let a used request pass as new with another proof.
   */
  identity: string;
  /**
   * hex SHA-256 of JCS(request), proof included: the identity of packages issued before the
   * identity above, so a request answered then is still recognised when it is sent again.
   */
  formerIdentity: string;
}

/** The exact string the device signs for `device_proof`. */
export function offlineRequestMessage(request: Omit<OfflineRequestBody, "device_proof">): string {
  return PREFIX.offlineRequest + canonicalize(request);
}

/**
 * The checks that need no store: product, both keys, and the device proof over the request. Field
 * errors go to `errors` (keyed `request.<field>`); returns null when any check failed.
 */
export function verifyOfflineRequest(
  request: OfflineRequestBody,
  productId: string,
  errors: FieldErrorCollector,
): VerifiedRequest | null {
  if (request.product_id !== productId) errors.add("request.product_id", "is not the license's product");
  const signingKey = parsePublicKey(request.device_signing_public_key);
  const kemKey = parsePublicKey(request.device_kem_public_key);
  if (!signingKey)
    errors.add(
      "request.device_signing_public_key",
      "must be ed25519:<b64u 32 bytes> or p256:<b64u 65-byte point>",
    );
  if (kemKey?.alg !== "p256")
    errors.add("request.device_kem_public_key", "must be p256:<b64u 65-byte uncompressed point>");
  if (!signingKey || kemKey?.alg !== "p256") return null;
  const { device_proof, ...signed } = request;
  const message = offlineRequestMessage(signed);
  if (!verifySignature(signingKey, message, device_proof)) {
    errors.add("request.device_proof", "does not verify with device_signing_public_key over this request");
    return null;
  }
  return {
    signingKey,
    kemKey,
    identity: sha256Hex(message),
    formerIdentity: sha256Hex(canonicalize(request)),
  };
}

/** A new package needs a recent request; a repeated one is judged by its stored package instead. */
export function checkFreshness(generatedAt: number, nowSec: number, errors: FieldErrorCollector): void {
  if (generatedAt < nowSec - OFFLINE_REQUEST_MAX_AGE_SEC)
    errors.add("request.generated_at", "is more than 7 days old; generate a new request on the device");
  else if (generatedAt > nowSec + OFFLINE_REQUEST_MAX_AHEAD_SEC)
    errors.add(
      "request.generated_at",
      "is more than 300 seconds ahead of the server clock; check the device clock",
    );
}

export const EXPIRES_AT_RULE = "must be an RFC 3339 date-time, e.g. 2030-01-31T00:00:00Z";

/** `expires_at` as sent: undefined when absent; a field error when malformed. */
export function requestedExpiry(body: OfflineCertificateBody, errors: FieldErrorCollector): Date | undefined {
  if (body.expires_at === undefined) return undefined;
  const date = parseDateTime(body.expires_at);
  if (!date) errors.add("expires_at", EXPIRES_AT_RULE);
  return date ?? undefined;
}
