/**
 * Generic Cell Rate Algorithm: one number per key (the theoretical arrival time), so it is O(1) in
 * time and memory and needs no timers. `limit` requests are allowed per `windowSec`, in bursts of
 * up to `limit`.
 */
export interface RateLimitPolicy {
  name: string;
  limit: number;
  windowSec: number;
}

/** A window as configured: `limit` requests per `windowSec`; null where it is turned off. */
export type RateLimitSetting = Pick<RateLimitPolicy, "limit" | "windowSec">;

/** Runtime burst windows by partition (DESIGN §4 "Rate limits"); operators change them in config. */
export interface RuntimeRateLimitSettings {
  /** Unauthenticated runtime calls, per client address (IPv6: per /64). */
  ip: RateLimitSetting | null;
  /** Device-proof calls, per activation. */
  activation: RateLimitSetting | null;
  /** Device-proof calls, per license (all its activations together). */
  license: RateLimitSetting | null;
}

/**
 * Generous for real clients (a device checks in every few minutes at most; an office behind one
 * address activates many devices at once) and still far below what the service can answer.
 */
export const DEFAULT_RUNTIME_RATE_LIMITS: RuntimeRateLimitSettings = {
  ip: { limit: 600, windowSec: 60 },
  activation: { limit: 120, windowSec: 60 },
  license: { limit: 6_000, windowSec: 60 },
};

export interface RateLimitDecision {
  allowed: boolean;
  remaining: number;
  /** Seconds until the bucket is full again. */
  resetSec: number;
  /** Seconds to wait before a retry can succeed (0 when allowed). */
  retryAfterSec: number;
}

export class GcraLimiter {
  private readonly tat = new Map<string, number>();
  private readonly intervalMs: number;
  private readonly burstMs: number;
  private sweepAt = 0;

  constructor(readonly policy: RateLimitPolicy) {
    this.intervalMs = (policy.windowSec * 1000) / policy.limit;
    this.burstMs = policy.windowSec * 1000;
  }

  /** Takes one request from `key`'s bucket, unless it is empty. */
  check(key: string, nowMs: number): RateLimitDecision {
    const decision = this.peek(key, nowMs);
    if (decision.allowed) this.charge(key, nowMs);
    return decision;
  }

  /**
   * Whether one more request from `key` would be allowed, changing nothing. For requests that are
   * charged only once their answer shows who sent them (device-proof calls, see runtime-limits.ts).
   */
  peek(key: string, nowMs: number): RateLimitDecision {
    this.sweep(nowMs);
    const tat = this.arrival(key, nowMs);
    const newTat = tat + this.intervalMs;
    const allowAt = newTat - this.burstMs;
    if (allowAt > nowMs) {
      return {
        allowed: false,
        remaining: 0,
        resetSec: Math.ceil((tat - nowMs) / 1000),
        retryAfterSec: Math.max(1, Math.ceil((allowAt - nowMs) / 1000)),
      };
    }
    return {
      allowed: true,
      remaining: Math.floor((this.burstMs - (newTat - nowMs)) / this.intervalMs),
      resetSec: Math.ceil((newTat - nowMs) / 1000),
      retryAfterSec: 0,
    };
  }

  /** `peek(key, nowMs).allowed` without making the decision: for checks on the hot path. */
  allows(key: string, nowMs: number): boolean {
    this.sweep(nowMs);
    return this.arrival(key, nowMs) + this.intervalMs - this.burstMs <= nowMs;
  }

  /**
   * Counts one request against `key` whatever the bucket holds: a request already answered still
   * used the service. Past a full bucket the debt grows by at most one window, so a key that keeps
   * going past its limit is refused for at most that long once it stops.
   */
  charge(key: string, nowMs: number): void {
    // Some limiters are charged for keys they are never asked about (runtime-limits.ts), so
    // charging sweeps too: memory stays bounded by the keys charged within about two windows.
    this.sweep(nowMs);
    const tat = this.arrival(key, nowMs);
    this.tat.set(key, Math.min(tat + this.intervalMs, nowMs + 2 * this.burstMs));
  }

  /**
   * `key`'s theoretical arrival time, never before now. Charging never sets it more than two windows
   * ahead, so one further ahead was set before the wall clock stepped back (an NTP correction, a
   * resumed VM): it is forgotten, as a key not seen, instead of refusing the key for as long as the
   * clock went back. A step back of less than that costs at most those two windows.
   */
  private arrival(key: string, nowMs: number): number {
    const tat = this.tat.get(key);
    if (tat === undefined || tat > nowMs + 2 * this.burstMs) return nowMs;
    return Math.max(tat, nowMs);
  }

  /** IETF httpapi RateLimit headers (draft-ietf-httpapi-ratelimit-headers), plus Retry-After on refusal. */
  headers(decision: RateLimitDecision): Record<string, string> {
    const name = this.policy.name;
    const headers: Record<string, string> = {
      "ratelimit-policy": `"${name}";q=${this.policy.limit};w=${this.policy.windowSec}`,
      ratelimit: `"${name}";r=${decision.remaining};t=${decision.resetSec}`,
    };
    if (!decision.allowed) headers["retry-after"] = String(decision.retryAfterSec);
    return headers;
  }

  /** Keys remembered (those whose bucket has not refilled, and some that have, until the next sweep). */
  get size(): number {
    return this.tat.size;
  }

  /**
   * Forget keys whose bucket has refilled, which are indistinguishable from new keys, and those set
   * before the clock stepped back (see `arrival`).
   */
  private sweep(nowMs: number): void {
    // A sweep due more than a window ahead was planned before the clock stepped back: sweep now.
    if (nowMs < this.sweepAt && this.sweepAt - nowMs <= this.burstMs) return;
    this.sweepAt = nowMs + this.burstMs;
    const ahead = nowMs + 2 * this.burstMs;
    for (const [key, tat] of this.tat) if (tat <= nowMs || tat > ahead) this.tat.delete(key);
  }
}
