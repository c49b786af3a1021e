import { expect } from "bun:test";
import type { CallResult } from "./harness.ts";

/** A 429 from the named burst window, in the error envelope, with Retry-After and RateLimit headers that agree. */
export function expectRateLimited(response: CallResult, policy: string, limit: number, windowSec: number) {
  expect(response.status).toBe(429);
  expect(response.body.error).toMatchObject({
    code: "RATE_LIMITED",
    retryable: true,
    details: { policy, limit, window_sec: windowSec },
  });
  expect(Object.keys(response.body.error).sort()).toEqual(
    ["code", "details", "doc_url", "message", "request_id", "retryable"].sort(),
  );
  const retryAfter = Number(response.headers.get("retry-after"));
  expect(retryAfter).toBeGreaterThan(0);
  expect(retryAfter).toBeLessThanOrEqual(windowSec);
  expect(response.body.error.details.retry_after_sec).toBe(retryAfter);
  expect(response.headers.get("ratelimit-policy")).toBe(`"${policy}";q=${limit};w=${windowSec}`);
  expect(response.headers.get("ratelimit")).toMatch(new RegExp(`^"${policy}";r=0;t=\\d+$`));
}
