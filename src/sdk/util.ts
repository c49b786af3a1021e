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

/**
 * A queue of async changes that run one at a time, each after the one before has settled (failed
 * ones included), for read-decide-write steps on storage that must not interleave.
 */
export function serialized(): <T>(change: () => Promise<T>) => Promise<T> {
  let last: Promise<unknown> = Promise.resolve();
  return (change) => {
    const run = last.then(change);
    last = run.catch(() => undefined);
    return run;
  };
}
