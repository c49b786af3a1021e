/**
 * The byte strings the device signs (DESIGN §5), nonces and idempotency keys.
 */
import { b64uEncode, randomBytes, sha256Hex, utf8 } from "./encoding.ts";
import { canonicalize } from "./jcs.ts";
import { type DeviceKeys, sign } from "./keys.ts";

/** Domain-separation prefixes, each followed by "\n". */
export const PREFIX = {
  trustBundle: "Service-Trust-Bundle-v1\n",
  delegation: "Service-Delegation-v1\n",
  response: "Service-Response-v1\n",
  activationProof: "Service-Activation-Proof-v1\n",
  trialProof: "Service-Trial-Proof-v1\n",
  deviceProof: "Service-Device-Proof-v1\n",
  offlineRequest: "Service-Offline-Request-v1\n",
  offlinePackage: "Service-Offline-Package-v1\n",
} as const;

export const NONCE_PATTERN = /^[A-Za-z0-9_-]{22,255}$/;

/** 16 random bytes, b64u: 22 characters. */
export function newNonce(): string {
  return b64uEncode(randomBytes(16));
}

/** 24 random bytes, b64u: 32 characters (the spec allows 16 to 255). */
export function newIdempotencyKey(): string {
  return b64uEncode(randomBytes(24));
}

/** The message signed for `device_proof`: prefix + JCS(body without device_proof). */
export function activationProofMessage(bodyWithoutProof: Record<string, unknown>): string {
  if ("device_proof" in bodyWithoutProof) throw new Error("body must not contain device_proof");
  return PREFIX.activationProof + canonicalize(bodyWithoutProof);
}

export function signActivationProof(keys: DeviceKeys, bodyWithoutProof: Record<string, unknown>): string {
  return sign(keys.signing, utf8(activationProofMessage(bodyWithoutProof)));
}

/** The message signed for a trial confirmation's `device_proof`: its own prefix, never the activation one. */
export function trialProofMessage(bodyWithoutProof: Record<string, unknown>): string {
  if ("device_proof" in bodyWithoutProof) throw new Error("body must not contain device_proof");
  return PREFIX.trialProof + canonicalize(bodyWithoutProof);
}

export function signTrialProof(keys: DeviceKeys, bodyWithoutProof: Record<string, unknown>): string {
  return sign(keys.signing, utf8(trialProofMessage(bodyWithoutProof)));
}

export interface DeviceProofInput {
  /** Upper-case HTTP method as sent. */
  method: string;
  /** The request target's path and query exactly as sent (e.g. "/runtime/v1/leases"). */
  pathAndQuery: string;
  activationId: string;
  /** Unix seconds. */
  timestamp: number;
  nonce: string;
  /** The raw request body bytes; empty when there is no body. */
  body: Uint8Array;
}

/**
 * "Service-Device-Proof-v1\n" + METHOD + "\n" + path-and-query + "\n" + activation id + "\n" +
 * timestamp + "\n" + nonce + "\n" + hex(SHA-256(raw body bytes)). No trailing newline.
 */
export function deviceProofMessage(input: DeviceProofInput): string {
  if (!Number.isSafeInteger(input.timestamp)) throw new Error("timestamp must be an integer");
  return (
    PREFIX.deviceProof +
    [
      input.method.toUpperCase(),
      input.pathAndQuery,
      input.activationId,
      String(input.timestamp),
      input.nonce,
      sha256Hex(input.body),
    ].join("\n")
  );
}

/** The four device-proof headers for one request. */
export function deviceProofHeaders(keys: DeviceKeys, input: DeviceProofInput): Record<string, string> {
  return {
    "X-Service-Activation": input.activationId,
    "X-Service-Timestamp": String(input.timestamp),
    "X-Service-Nonce": input.nonce,
    "X-Service-Signature": sign(keys.signing, utf8(deviceProofMessage(input))),
  };
}
