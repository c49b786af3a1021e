/**
 * The heartbeat loop. It runs heartbeats on an injectable timer and decides the next delay:
 *
 * - after a verified heartbeat: `next_heartbeat_in` seconds;
 * - 429 or 503 with Retry-After: that delay, at most an hour (MAX_RETRY_AFTER_MS);
 * - anything else that failed (network error, 5xx, 429/503 without Retry-After, a response that
 *   failed verification, other unsigned errors): exponential back-off with full jitter,
 *   random() * min(maxMs, baseMs * 2^(failures - 1));
 * - it stops for good on an authentic LICENSE_REVOKED, LICENSE_EXPIRED, ACTIVATION_DEACTIVATED or
 *   NAMED_USER_ASSIGNMENT_UNAVAILABLE from the server (not on an answer a stored denial overtook:
 *   denials.ts), when the client is not activated, and on stop().
 */
import { isOvertaken } from "./denials.ts";
import { SdkError } from "./errors.ts";

/** setTimeout/clearTimeout. The callback may return a promise (fake timers can await it). */
export interface Timer {
  setTimeout(callback: () => unknown, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const defaultTimer: Timer = {
  setTimeout: (callback, ms) => globalThis.setTimeout(callback, ms),
  clearTimeout: (handle) => globalThis.clearTimeout(handle as ReturnType<typeof globalThis.setTimeout>),
};

export type LoopStopReason =
  | "stopped"
  | "LICENSE_REVOKED"
  | "LICENSE_EXPIRED"
  | "ACTIVATION_DEACTIVATED"
  | "NAMED_USER_ASSIGNMENT_UNAVAILABLE"
  | "NOT_ACTIVATED";

export interface BackoffOptions {
  /** First back-off ceiling, ms (default 1000). */
  baseMs?: number;
  /** Largest back-off ceiling, ms (default 300000). */
  maxMs?: number;
}

export interface HeartbeatLoopCallbacks<R> {
  onHeartbeat?: (result: R) => void;
  /** Called for every failed attempt with the delay before the next one. */
  onError?: (error: unknown, retryInMs: number) => void;
  onStop?: (reason: LoopStopReason, error?: unknown) => void;
}

/**
 * The longest Retry-After honoured. The header is unsigned: a proxy's or a misconfigured
 * server's `Retry-After: 2592000` must not silence the device for a month.
 */
export const MAX_RETRY_AFTER_MS = 3_600_000;

/**
 * The longest delay timers hold (2^31 - 1 ms, about 24.8 days). Node, Bun and browsers run a
 * longer one at once, and the server may ask for heartbeats 30 days apart: longer waits are
 * chained.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

const TERMINAL = new Set([
  "LICENSE_REVOKED",
  "LICENSE_EXPIRED",
  "ACTIVATION_DEACTIVATED",
  "NAMED_USER_ASSIGNMENT_UNAVAILABLE",
]);

/** The next delay after a failure, or a stop reason. Exported for tests. */
export function delayAfterError(
  error: unknown,
  failures: number,
  random: () => number,
  backoff: Required<BackoffOptions>,
): { stop: LoopStopReason } | { delayMs: number } {
  if (error instanceof SdkError) {
    // An answer overtaken by a stored denial of its own second or later is not the server's
    // refusal of this heartbeat (a license renewed in that second would stay stopped): the next
    // answer decides.
    if (error.kind === "license" && TERMINAL.has(error.code) && !isOvertaken(error))
      return { stop: error.code as LoopStopReason };
    if (error.kind === "usage" && error.code === "NOT_ACTIVATED") return { stop: "NOT_ACTIVATED" };
    if ((error.status === 429 || error.status === 503) && error.retryAfterMs !== undefined) {
      return { delayMs: Math.min(error.retryAfterMs, MAX_RETRY_AFTER_MS) };
    }
  }
  const ceiling = Math.min(backoff.maxMs, backoff.baseMs * 2 ** Math.max(0, failures - 1));
  return { delayMs: Math.floor(random() * ceiling) };
}

export class HeartbeatLoop<R extends { nextHeartbeatIn: number }> {
  private handle: unknown;
  private active = false;
  private failures = 0;
  private generation = 0;
  private readonly backoff: Required<BackoffOptions>;

  constructor(
    private readonly run: () => Promise<R>,
    private readonly timer: Timer,
    private readonly random: () => number,
    backoff: BackoffOptions,
    private readonly callbacks: HeartbeatLoopCallbacks<R>,
  ) {
    this.backoff = { baseMs: backoff.baseMs ?? 1000, maxMs: backoff.maxMs ?? 300_000 };
  }

  get running(): boolean {
    return this.active;
  }

  start(initialDelayMs: number): void {
    if (this.active) return;
    this.active = true;
    this.failures = 0;
    this.schedule(initialDelayMs);
  }

  stop(): void {
    if (!this.active) return;
    this.finish("stopped");
  }

  private finish(reason: LoopStopReason, error?: unknown): void {
    this.active = false;
    this.generation++;
    if (this.handle !== undefined) this.timer.clearTimeout(this.handle);
    this.handle = undefined;
    this.callbacks.onStop?.(reason, error);
  }

  private schedule(ms: number): void {
    const generation = this.generation;
    // NaN (a stored interval that is not a number) runs at once, as a timer would.
    const wait = ms > 0 ? ms : 0;
    if (wait > MAX_TIMER_MS) {
      this.handle = this.timer.setTimeout(() => {
        if (this.active && generation === this.generation) this.schedule(wait - MAX_TIMER_MS);
      }, MAX_TIMER_MS);
      return;
    }
    this.handle = this.timer.setTimeout(() => this.tick(generation), wait);
  }

  private async tick(generation: number): Promise<void> {
    if (!this.active || generation !== this.generation) return;
    this.handle = undefined;
    let result: R;
    try {
      result = await this.run();
    } catch (error) {
      if (!this.active || generation !== this.generation) return;
      this.failures++;
      const next = delayAfterError(error, this.failures, this.random, this.backoff);
      if ("stop" in next) {
        this.finish(next.stop, error);
        return;
      }
      this.schedule(next.delayMs);
      this.safe(() => this.callbacks.onError?.(error, next.delayMs));
      return;
    }
    if (!this.active || generation !== this.generation) return;
    this.failures = 0;
    this.schedule(result.nextHeartbeatIn * 1000);
    this.safe(() => this.callbacks.onHeartbeat?.(result));
  }

  private safe(fn: () => void): void {
    try {
      fn();
    } catch {
      // A throwing callback must not break the loop.
    }
  }
}
