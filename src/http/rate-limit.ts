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

  check(key: string, nowMs: number): RateLimitDecision {
    this.sweep(nowMs);
    const tat = Math.max(this.tat.get(key) ?? nowMs, nowMs);
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
    this.tat.set(key, newTat);
    return {
      allowed: true,
      remaining: Math.floor((this.burstMs - (newTat - nowMs)) / this.intervalMs),
      resetSec: Math.ceil((newTat - nowMs) / 1000),
      retryAfterSec: 0,
    };
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

  /** Forget keys whose bucket has refilled: they are indistinguishable from new keys. */
  private sweep(nowMs: number): void {
    if (nowMs < this.sweepAt) return;
    this.sweepAt = nowMs + this.burstMs;
    for (const [key, tat] of this.tat) if (tat <= nowMs) this.tat.delete(key);
  }
}
