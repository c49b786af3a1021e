import type { Clock } from "../domain/clock.ts";
import type { Logger } from "../http/logger.ts";
import type { Resolver } from "../modules/webhooks/address.ts";

/** The webhook dispatcher's limits and what its caller (the server, or a test) may set. */
export const PER_ENDPOINT_CONCURRENCY = 2;
export const GLOBAL_CONCURRENCY = 16;
/**
 * A successful attempt that took this long makes its endpoint limited, like a failed one, until an
 * attempt is quicker again: a receiver that answers 2xx after 8 s holds its slots as long as one
 * that hangs.
 */
export const SLOW_ATTEMPT_MS = 2_000;
/**
 * A claim outlives its attempt's timeout by this much; then a claim left by a dead process is due
 * again. The timeout bounds the whole attempt, DNS included (webhook-attempt.ts), so a live
 * process's claim never lapses while its attempt runs.
 */
export const CLAIM_MARGIN_MS = 15_000;

export interface DispatcherOptions {
  logger: Logger;
  allowPrivateNetworks: boolean;
  resolver?: Resolver;
  /** Schedules retries and claims; the store's clock (the test clock moves it). */
  clock?: Clock;
  /**
   * The `webhook-timestamp` of an attempt: real time, because receivers check it against their own
   * clock (Standard Webhooks allows 5 minutes). The test clock does not move it.
   */
  wallClock?: Clock;
  timeoutMs?: number;
  perEndpointConcurrency?: number;
  globalConcurrency?: number;
  /** A successful attempt at least this long counts as slow (SLOW_ATTEMPT_MS by default). */
  slowAttemptMs?: number;
  retryDelaysSec?: readonly number[];
  /** A number in [0, 1); Math.random by default. */
  random?: () => number;
  pollMs?: number;
  expiryScanMs?: number;
  /** Rows of the leases table per call of the expiry scan (expiries.ts); tests make it small. */
  leaseScanChunk?: number;
  /**
   * Tests only, never reachable from configuration: the origin to connect to instead of the URL's
   * own (team-chat hosts cannot be reached from a test). Skips the address check, as a test
   * receiver is on loopback.
   */
  connectOverride?: (url: URL) => string | undefined;
  /** Tests only, never reachable from configuration: a CA to trust besides the system's (a test TLS receiver). */
  extraCa?: string;
  /**
   * Tests only: the milliseconds an attempt's duration, and the time between lines of a repeated
   * dispatch failure, are measured in (performance.now by default).
   */
  monotonicMs?: () => number;
}
