/**
 * One error class for everything the SDK throws. `code` is stable and documented in docs/sdk.md.
 *
 * `kind` tells where the error comes from:
 * - "verification": a response, bundle or certificate failed a check; nothing was stored.
 * - "license": an AUTHENTIC, signed license-state denial (LICENSE_REVOKED, LICENSE_EXPIRED,
 *   LICENSE_SUSPENDED, ACTIVATION_DEACTIVATED) that passed the full verification chain.
 * - "server": an unsigned error response; `code` is the server's error code. Never license state.
 * - "network": fetch failed or the body could not be read.
 * - "usage": the SDK was called wrongly or is not configured (CONFIG_INVALID, NOT_ACTIVATED, ...).
 * - "storage": persisted state could not be read back, or the storage adapter failed.
 */

export type SdkErrorKind = "verification" | "license" | "server" | "network" | "usage" | "storage";

/** Codes raised by the SDK itself. Server codes pass through on kind "server" and "license". */
export type SdkErrorCode =
  // configuration and usage
  | "CONFIG_INVALID"
  | "TRUST_ANCHOR_UNAVAILABLE"
  | "INVALID_ARGUMENT"
  | "NOT_ACTIVATED"
  | "ALREADY_ACTIVATED"
  | "STORAGE_CORRUPT"
  | "STORAGE_UNAVAILABLE"
  | "DEVICE_KEYS_CHANGED"
  | "CRYPTO_UNAVAILABLE"
  // transport
  | "NETWORK_ERROR"
  | "HTTP_ERROR"
  | "RESPONSE_INVALID"
  | "RESPONSE_UNSIGNED"
  // trust bundle
  | "BUNDLE_INVALID"
  | "BUNDLE_ROOT_MISMATCH"
  | "BUNDLE_SIGNATURE_INVALID"
  | "BUNDLE_ENVIRONMENT_MISMATCH"
  | "BUNDLE_SEQUENCE_ROLLBACK"
  | "BUNDLE_UNCONFIRMED"
  // product signing keys
  | "KEY_UNKNOWN"
  | "KEY_COMPROMISED"
  | "KEY_NOT_VALID"
  // delegation
  | "DELEGATION_INVALID"
  | "DELEGATION_SIGNATURE_INVALID"
  | "DELEGATION_EXPIRED"
  // response assertion
  | "ASSERTION_INVALID"
  | "ONLINE_KEY_MISMATCH"
  | "RESPONSE_SIGNATURE_INVALID"
  | "NONCE_MISMATCH"
  | "STATUS_MISMATCH"
  | "PRODUCT_MISMATCH"
  | "BODY_HASH_MISMATCH"
  // response content
  | "TIME_MISMATCH"
  | "MACHINE_INFO_DIGEST_MISMATCH"
  | "ACTIVATION_MISMATCH"
  | "LEASE_MISMATCH"
  // license certificate
  | "CERTIFICATE_INVALID"
  | "CERTIFICATE_SIGNATURE_INVALID"
  | "CERTIFICATE_MISMATCH"
  | "CERTIFICATE_DEVICE_MISMATCH"
  | "CERTIFICATE_NOT_YET_VALID"
  // offline package
  | "PACKAGE_INVALID"
  | "PACKAGE_SIGNATURE_INVALID"
  | "PACKAGE_HASH_MISMATCH"
  | "PACKAGE_DEVICE_MISMATCH"
  | "PACKAGE_EXPIRED"
  | "PACKAGE_SUPERSEDED"
  | "PACKAGE_ACTIVATION_ENDED"
  // sealed file
  | "SEALED_FILE_FORMAT"
  | "SEALED_FILE_MISMATCH"
  | "SEALED_FILE_KEY_INVALID"
  | "SEALED_FILE_TRUNCATED"
  | "SEALED_FILE_TRAILING_DATA"
  | "SEALED_FILE_TAMPERED";

/** The error envelope of spec §7.1, as the server sent it. */
export interface ServerErrorBody {
  code: string;
  message: string;
  request_id: string;
  retryable: boolean;
  doc_url?: string;
  details: Record<string, unknown>;
}

/** The signed license-state denials (DESIGN §5). */
export const LICENSE_DENIAL_CODES = [
  "LICENSE_REVOKED",
  "LICENSE_EXPIRED",
  "LICENSE_SUSPENDED",
  "ACTIVATION_DEACTIVATED",
  // A named user whose assignment to the license ended: this device may not use it any more.
  "NAMED_USER_ASSIGNMENT_UNAVAILABLE",
] as const;
export type LicenseDenialCode = (typeof LICENSE_DENIAL_CODES)[number];

export function isLicenseDenialCode(code: string): code is LicenseDenialCode {
  return (LICENSE_DENIAL_CODES as readonly string[]).includes(code);
}

export interface SdkErrorInit {
  kind: SdkErrorKind;
  details?: Record<string, unknown>;
  status?: number;
  retryable?: boolean;
  requestId?: string;
  retryAfterMs?: number;
  serverError?: ServerErrorBody;
  cause?: unknown;
}

export class SdkError extends Error {
  override name = "SdkError";
  /** SdkErrorCode, or the server's code when kind is "server" or "license". */
  readonly code: string;
  readonly kind: SdkErrorKind;
  readonly details: Record<string, unknown>;
  /** HTTP status of the response, when there was one. */
  readonly status: number | undefined;
  readonly retryable: boolean;
  readonly requestId: string | undefined;
  /** Parsed `Retry-After` header (429/503), in milliseconds. */
  readonly retryAfterMs: number | undefined;
  /** The server's error envelope, for kind "server" and "license". */
  readonly serverError: ServerErrorBody | undefined;

  constructor(code: SdkErrorCode | (string & {}), message: string, init: SdkErrorInit) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.code = code;
    this.kind = init.kind;
    this.details = init.details ?? {};
    this.status = init.status;
    this.retryable = init.retryable ?? false;
    this.requestId = init.requestId;
    this.retryAfterMs = init.retryAfterMs;
    this.serverError = init.serverError;
  }

  /** True for a signed, fully verified license-state denial. */
  get authentic(): boolean {
    return this.kind === "license";
  }
}

/** Shorthand for a verification failure. */
export function verificationError(
  code: SdkErrorCode,
  message: string,
  details?: Record<string, unknown>,
): SdkError {
  return new SdkError(code, message, { kind: "verification", details: details ?? {} });
}

export function usageError(code: SdkErrorCode, message: string, details?: Record<string, unknown>): SdkError {
  return new SdkError(code, message, { kind: "usage", details: details ?? {} });
}
