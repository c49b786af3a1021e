import { normalizeCrockford, randomCrockford } from "./base32.ts";

/** 25 Crockford characters = 125 bits of randomness, shown as five dash-separated groups of five. */
const KEY_CHARS = 25;
const GROUP = 5;
const CANONICAL = /^[0-9A-HJKMNP-TV-Z]{25}$/;

export function generateLicenseKey(): string {
  return formatLicenseKey(randomCrockford(KEY_CHARS));
}

/**
 * Canonical form used for lookup: upper case, no dashes or spaces, Crockford aliases folded.
 * Returns null when the input cannot be a license key at all.
 */
export function canonicalLicenseKey(input: string): string | null {
  // Fewer characters than a key has cannot be one (separators only add): most inputs that reach
  // here are path segments checked by the request log, on every request.
  if (input.length > 64 || input.length < KEY_CHARS) return null;
  const compact = normalizeCrockford(input.replace(/[-\s]/g, ""));
  return CANONICAL.test(compact) ? compact : null;
}

export function formatLicenseKey(canonical: string): string {
  const groups: string[] = [];
  for (let i = 0; i < canonical.length; i += GROUP) groups.push(canonical.slice(i, i + GROUP));
  return groups.join("-");
}
