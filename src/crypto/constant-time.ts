import { createHash, timingSafeEqual } from "node:crypto";

const digest = (value: string | Uint8Array) => createHash("sha256").update(value).digest();

/**
 * Equality of secret material (tokens, codes, HMACs, digests) whose time does not depend on where
 * the two differ. Both sides are hashed to 32 bytes first, so a length difference neither shows
 * in the timing nor makes `timingSafeEqual` throw; equal digests mean equal inputs (SHA-256 is
 * collision resistant). Strings are compared as their UTF-8 bytes.
 */
export function constantTimeEqual(a: string | Uint8Array, b: string | Uint8Array): boolean {
  return timingSafeEqual(digest(a), digest(b));
}
