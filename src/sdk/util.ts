/** Small shape checks for untrusted JSON. */

export type Json = Record<string, unknown>;

export function isRecord(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function isString(value: unknown): value is string {
  return typeof value === "string";
}

export function isNonEmptyString(value: unknown): value is string {
  return typeof value === "string" && value.length > 0;
}

/** A JSON integer within ±2^53 (I-JSON). */
export function isInt(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value);
}

export function isNonNegativeInt(value: unknown): value is number {
  return isInt(value) && value >= 0;
}

export const HEX64 = /^[0-9a-f]{64}$/;

export function unixSeconds(ms: number): number {
  return Math.floor(ms / 1000);
}
