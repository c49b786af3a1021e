import { createHash, timingSafeEqual } from "node:crypto";
import { Elysia } from "elysia";
import { bearerToken } from "../../http/auth.ts";
import { ApiError } from "../../http/errors.ts";
import type { Metrics } from "../../http/metrics.ts";

const digest = (value: string) => createHash("sha256").update(value).digest();

/**
 * `GET /metrics` for Prometheus, mounted only when a metrics token is configured (without one the
 * route does not exist and answers 404). The token is its own secret, not an API key: a scraper
 * gets counters and nothing else. Compared as SHA-256 digests in constant time, so neither its
 * content nor its length leaks through timing.
 */
export const metricsController = (metrics: Metrics, token: string) => {
  const expected = digest(token);
  return new Elysia({ name: "metrics", detail: { hide: true } }).get("/metrics", ({ request }) => {
    const sent = bearerToken(request.headers.get("authorization"));
    if (sent === undefined || !timingSafeEqual(digest(sent), expected)) {
      throw new ApiError(
        "UNAUTHENTICATED",
        "Send the metrics token as 'Authorization: Bearer <token>'.",
        {},
        { headers: { "www-authenticate": 'Bearer realm="metrics"' } },
      );
    }
    return new Response(metrics.render(), {
      headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8", "cache-control": "no-store" },
    });
  });
};
