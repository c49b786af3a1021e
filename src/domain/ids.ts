import { CROCKFORD_ALPHABET } from "./base32.ts";

/** Every public id is `prefix_` + 26 time-ordered Crockford characters (48-bit ms time + 80 random bits). */
export const ID_PREFIXES = {
  product: "prod",
  policy: "pol",
  customer: "cus",
  license: "lic",
  activation: "act",
  lease: "lse",
  webhook: "whk",
  event: "evt",
  reseller: "rsl",
  verification: "ver",
  user: "usr",
  request: "req",
  apiKey: "key",
  block: "blk",
  offlinePackage: "olp",
  assignment: "asg",
} as const;

export type IdKind = keyof typeof ID_PREFIXES;

const TIME_CHARS = 10;
const RANDOM_CHARS = 16;
const ULID_PATTERN = /^[0-9A-HJKMNP-TV-Z]{26}$/;

/**
 * Monotonic: ids made in the same millisecond keep increasing, so "newest first" ordering by id
 * is exact even under bursts.
 */
export class IdGenerator {
  private lastTime = -1;
  private lastTimeText = "";
  private lastRandom: number[] = [];
  /** Random bytes drawn in bulk (every request makes an id): one system call per 256 ids. */
  private pool = new Uint8Array(0);
  private poolAt = 0;

  next(kind: IdKind, nowMs: number): string {
    return `${ID_PREFIXES[kind]}_${this.ulid(nowMs)}`;
  }

  /**
   * An id whose 80 random bits are all fresh, for ids that act as a capability (a verification's
   * id is what its confirm names). Monotonic ids made in the same millisecond differ by one, and
   * every answer's X-Request-Id shows where the counter stands: a caller sending requests around
   * someone's start could guess that start's id. Still time-ordered to the millisecond.
   */
  unguessable(kind: IdKind, nowMs: number): string {
    let out = `${ID_PREFIXES[kind]}_${encodeTime(nowMs)}`;
    for (const digit of this.freshRandom()) out += CROCKFORD_ALPHABET[digit];
    return out;
  }

  ulid(nowMs: number): string {
    let random: number[];
    if (nowMs <= this.lastTime) {
      random = increment(this.lastRandom);
      nowMs = this.lastTime;
    } else {
      random = this.freshRandom();
      this.lastTimeText = encodeTime(nowMs);
    }
    this.lastTime = nowMs;
    this.lastRandom = random;
    let out = this.lastTimeText;
    for (const digit of random) out += CROCKFORD_ALPHABET[digit];
    return out;
  }

  private freshRandom(): number[] {
    if (this.poolAt + RANDOM_CHARS > this.pool.length) {
      this.pool = crypto.getRandomValues(new Uint8Array(RANDOM_CHARS * 256));
      this.poolAt = 0;
    }
    const digits = new Array<number>(RANDOM_CHARS);
    for (let i = 0; i < RANDOM_CHARS; i++) digits[i] = (this.pool[this.poolAt + i] as number) & 31;
    // Each byte is used once: no two ids share random bits.
    this.poolAt += RANDOM_CHARS;
    return digits;
  }
}

/**
 * The smallest id of this prefix made at `ms`: ids are time-ordered, so `id <` it means "made
 * before `ms`", which lets a retention purge bound its walk along the id index.
 */
export function idBefore(prefix: string, ms: number): string {
  return `${prefix}_${encodeTime(ms)}${"0".repeat(RANDOM_CHARS)}`;
}

function encodeTime(ms: number): string {
  let out = "";
  let rest = ms;
  for (let i = 0; i < TIME_CHARS; i++) {
    out = CROCKFORD_ALPHABET[rest % 32] + out;
    rest = Math.floor(rest / 32);
  }
  return out;
}

function increment(digits: number[]): number[] {
  const next = [...digits];
  for (let i = next.length - 1; i >= 0; i--) {
    const digit = next[i] ?? 0;
    if (digit < 31) {
      next[i] = digit + 1;
      return next;
    }
    next[i] = 0;
  }
  throw new Error("ULID random part overflowed within one millisecond");
}

/** True when `value` has the shape of an id of this kind; used to answer 404 early for junk ids. */
export function isId(kind: IdKind, value: string): boolean {
  const prefix = `${ID_PREFIXES[kind]}_`;
  return value.startsWith(prefix) && ULID_PATTERN.test(value.slice(prefix.length));
}
