import { describe, expect, test } from "bun:test";
import { GcraLimiter, type RateLimitDecision } from "../../src/http/rate-limit.ts";

const T0 = 1_800_000_000_000;

/** 10 requests per minute: one every 6 s, bursts of 10. */
const perMinute = () => new GcraLimiter({ name: "mgmt", limit: 10, windowSec: 60 });

const burst = (limiter: GcraLimiter, key: string, count: number, nowMs: number): RateLimitDecision[] =>
  Array.from({ length: count }, () => limiter.check(key, nowMs));

describe("GcraLimiter decisions", () => {
  test("a burst of exactly the limit is allowed at one instant and the next request is refused", () => {
    const limiter = perMinute();
    const decisions = burst(limiter, "k", 10, T0);
    expect(decisions.every((d) => d.allowed)).toBe(true);
    const refused = limiter.check("k", T0);
    expect(refused.allowed).toBe(false);
    expect(refused.remaining).toBe(0);
    expect(refused.retryAfterSec).toBeGreaterThanOrEqual(1);
  });

  test("an allowed request has no retry-after", () => {
    expect(perMinute().check("k", T0).retryAfterSec).toBe(0);
  });

  test("remaining goes down by one with each allowed request until it reaches zero", () => {
    const decisions = burst(perMinute(), "k", 10, T0);
    expect(decisions.map((d) => d.remaining)).toEqual([9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
  });

  test("the limiter works the same with a one-second window", () => {
    const limiter = new GcraLimiter({ name: "fast", limit: 5, windowSec: 1 });
    expect(burst(limiter, "k", 5, T0).map((d) => d.remaining)).toEqual([4, 3, 2, 1, 0]);
    const refused = limiter.check("k", T0);
    expect(refused.allowed).toBe(false);
    expect(refused.retryAfterSec).toBe(1);
    expect(limiter.check("k", T0 + 199).allowed).toBe(false);
    expect(limiter.check("k", T0 + 200).allowed).toBe(true);
  });

  test("after a full burst one emission interval frees exactly one request", () => {
    const limiter = perMinute();
    burst(limiter, "k", 10, T0);
    expect(limiter.check("k", T0 + 5_999).allowed).toBe(false);
    expect(limiter.check("k", T0 + 6_000).allowed).toBe(true);
    expect(limiter.check("k", T0 + 6_000).allowed).toBe(false);
  });

  test("waiting the advertised Retry-After is enough, and one second less is not", () => {
    const limiter = perMinute();
    burst(limiter, "k", 10, T0);
    const refused = limiter.check("k", T0);
    expect(refused.retryAfterSec).toBe(6);
    expect(limiter.check("k", T0 + (refused.retryAfterSec - 1) * 1000).allowed).toBe(false);
    expect(limiter.check("k", T0 + refused.retryAfterSec * 1000).allowed).toBe(true);
  });

  test("refused requests do not push the recovery time further out", () => {
    const limiter = perMinute();
    burst(limiter, "k", 10, T0);
    for (let i = 0; i < 50; i++) expect(limiter.check("k", T0 + i * 100).allowed).toBe(false);
    expect(limiter.check("k", T0 + 6_000).allowed).toBe(true);
  });

  test("after a whole window of silence the full burst is available again", () => {
    const limiter = perMinute();
    burst(limiter, "k", 10, T0);
    const later = burst(limiter, "k", 10, T0 + 60_000);
    expect(later.every((d) => d.allowed)).toBe(true);
    expect(later[0]?.remaining).toBe(9);
    expect(limiter.check("k", T0 + 60_000).allowed).toBe(false);
  });

  test("a steady rate at the limit is always allowed", () => {
    const limiter = perMinute();
    for (let i = 0; i < 100; i++) expect(limiter.check("k", T0 + i * 6_000).allowed).toBe(true);
  });

  test("keys are limited independently of each other", () => {
    const limiter = perMinute();
    burst(limiter, "a", 10, T0);
    expect(limiter.check("a", T0).allowed).toBe(false);
    const other = burst(limiter, "b", 10, T0);
    expect(other.every((d) => d.allowed)).toBe(true);
    expect(other[0]?.remaining).toBe(9);
    expect(limiter.check("b", T0).allowed).toBe(false);
  });

  test("reset counts the seconds until the bucket is full again", () => {
    const limiter = perMinute();
    expect(limiter.check("k", T0).resetSec).toBe(6);
    expect(limiter.check("k", T0).resetSec).toBe(12);
  });
});

describe("GcraLimiter headers", () => {
  test("an allowed response carries RateLimit-Policy and RateLimit but no Retry-After", () => {
    const limiter = perMinute();
    const headers = new Headers(limiter.headers(limiter.check("k", T0)));
    expect(headers.get("RateLimit-Policy")).toBe('"mgmt";q=10;w=60');
    expect(headers.get("RateLimit")).toBe('"mgmt";r=9;t=6');
    expect(headers.has("Retry-After")).toBe(false);
  });

  test("the RateLimit header reports the remaining count of each decision", () => {
    const limiter = perMinute();
    const seen = burst(limiter, "k", 3, T0).map((d) => new Headers(limiter.headers(d)).get("RateLimit"));
    expect(seen).toEqual(['"mgmt";r=9;t=6', '"mgmt";r=8;t=12', '"mgmt";r=7;t=18']);
  });

  test("a refused response adds Retry-After in whole seconds and reports zero remaining", () => {
    const limiter = perMinute();
    burst(limiter, "k", 10, T0);
    const headers = new Headers(limiter.headers(limiter.check("k", T0)));
    expect(headers.get("Retry-After")).toBe("6");
    expect(headers.get("RateLimit")).toMatch(/^"mgmt";r=0;t=\d+$/);
    expect(headers.get("RateLimit-Policy")).toBe('"mgmt";q=10;w=60');
  });

  test("the policy name appears quoted in both headers", () => {
    const limiter = new GcraLimiter({ name: "runtime-ip", limit: 3, windowSec: 10 });
    const headers = new Headers(limiter.headers(limiter.check("1.2.3.4", T0)));
    expect(headers.get("RateLimit-Policy")).toBe('"runtime-ip";q=3;w=10');
    expect(headers.get("RateLimit")?.startsWith('"runtime-ip";r=2;t=')).toBe(true);
  });
});

describe("GcraLimiter when the wall clock steps back", () => {
  const HOUR_MS = 3_600_000;

  test("a key used just before the clock stepped back an hour is not refused for that hour", () => {
    const limiter = perMinute();
    burst(limiter, "spent", 10, T0);
    limiter.check("light", T0);
    for (const key of ["spent", "light"]) {
      expect(limiter.peek(key, T0 - HOUR_MS).allowed).toBe(true);
      expect(limiter.allows(key, T0 - HOUR_MS)).toBe(true);
      expect(limiter.check(key, T0 - HOUR_MS)).toMatchObject({ allowed: true, retryAfterSec: 0 });
    }
  });

  test("a step back shorter than two windows keeps a spent key's debt", () => {
    const limiter = perMinute();
    burst(limiter, "spent", 10, T0);
    const refused = limiter.check("spent", T0 - 30_000);
    expect(refused.allowed).toBe(false);
    expect(refused.retryAfterSec).toBeLessThanOrEqual(2 * 60 + 30);
  });

  test("keys refilled before the step are still forgotten after it", () => {
    const limiter = perMinute();
    for (let i = 0; i < 100; i++) limiter.charge(`k${i}`, T0);
    limiter.peek("other", T0 - HOUR_MS);
    limiter.peek("other", T0 - HOUR_MS + 60_000 + 6_000);
    expect(limiter.size).toBe(0);
  });
});

describe("GcraLimiter memory", () => {
  test("keys whose bucket has refilled are forgotten, also when the limiter is only ever charged", () => {
    const limiter = perMinute();
    // Keys shaped like the per-address-and-activation windows of failing device proofs.
    for (let i = 0; i < 1_000; i++) limiter.charge(`2001:db8:0:${i.toString(16)}::/64 act_${i}`, T0);
    expect(limiter.size).toBeGreaterThan(0);
    expect(limiter.size).toBeLessThanOrEqual(1_000);
    limiter.charge("203.0.113.1 act_x", T0 + 60_000 + 6_000);
    expect(limiter.size).toBe(1);
  });

  test("keys still owing are kept when the others are forgotten", () => {
    const limiter = perMinute();
    limiter.charge("old", T0);
    burst(limiter, "busy", 10, T0 + 50_000);
    limiter.peek("other", T0 + 60_000 + 6_000);
    expect(limiter.size).toBe(1);
    expect(limiter.peek("busy", T0 + 60_000 + 6_000).allowed).toBe(true);
  });
});
