import { timingSafeEqual } from "node:crypto";
import type { SecretBox } from "../crypto/secret-box.ts";

/**
 * Emailed verification codes (DESIGN §4 "Email codes"): six digits from a CSPRNG by rejection
 * sampling, kept only as an HMAC under the data key's lookup key, bound to the verification, valid
 * 10 minutes and for 5 attempts, single use. The attempt is counted before the comparison, so a
 * guess costs an attempt even when the process stops in between.
 */

export const CODE_LENGTH = 6;
export const CODE_TTL_SEC = 600;
export const CODE_MAX_ATTEMPTS = 5;

const CODE_SPACE = 10 ** CODE_LENGTH;
// The largest multiple of 10^6 that fits in 32 bits: values at or above it are drawn again, so
// every code is exactly equally likely.
const ACCEPT_BELOW = Math.floor(2 ** 32 / CODE_SPACE) * CODE_SPACE;
const CODE_PATTERN = /^[0-9]{6}$/;
const HMAC_PURPOSE = "verification-code";

export function generateCode(): string {
  const draw = new Uint32Array(1);
  for (;;) {
    crypto.getRandomValues(draw);
    const value = draw[0] as number;
    if (value < ACCEPT_BELOW) return String(value % CODE_SPACE).padStart(CODE_LENGTH, "0");
  }
}

export const isWellFormedCode = (code: string): boolean => CODE_PATTERN.test(code);

/** The stored form: HMAC over the verification id and the code, so a hash is useless for any other verification. */
export const hashCode = (secrets: SecretBox, verificationId: string, code: string): string =>
  secrets.lookupHash(`${verificationId}\0${code}`, HMAC_PURPOSE);

/** Constant time over equal-length hex digests; a malformed code still costs one HMAC. */
export function codeMatches(
  secrets: SecretBox,
  verificationId: string,
  code: string,
  storedHash: string,
): boolean {
  const candidate = Buffer.from(hashCode(secrets, verificationId, isWellFormedCode(code) ? code : ""), "hex");
  const stored = Buffer.from(storedHash, "hex");
  return candidate.length === stored.length && timingSafeEqual(candidate, stored) && isWellFormedCode(code);
}

export interface CodeState {
  id: string;
  codeHash: string;
  /** Attempts already used. */
  attempts: number;
  expiresAt: Date;
  /** Set once used or replaced by a newer start. */
  closedAt: Date | null;
}

export type CodeCheck =
  /** Too late, used, replaced or out of attempts: 410, and nothing to persist. */
  | { outcome: "expired" }
  /** Persist `attempts` before answering. */
  | { outcome: "invalid"; attempts: number; remainingAttempts: number }
  | { outcome: "match"; attempts: number; remainingAttempts: number };

/**
 * Decides one confirmation attempt. The caller persists `attempts` in the same transaction as any
 * effect of the answer. `otherMismatch` (wrong address, wrong device key) makes the attempt fail
 * after the same HMAC work as a wrong code, so the two cannot be told apart.
 */
export function checkCode(
  secrets: SecretBox,
  state: CodeState,
  code: string,
  now: Date,
  otherMismatch = false,
): CodeCheck {
  if (
    state.closedAt !== null ||
    now.getTime() >= state.expiresAt.getTime() ||
    state.attempts >= CODE_MAX_ATTEMPTS
  ) {
    return { outcome: "expired" };
  }
  const attempts = state.attempts + 1;
  const remainingAttempts = CODE_MAX_ATTEMPTS - attempts;
  const matches = codeMatches(secrets, state.id, code, state.codeHash);
  return matches && !otherMismatch
    ? { outcome: "match", attempts, remainingAttempts }
    : { outcome: "invalid", attempts, remainingAttempts };
}
