import type { Deps } from "../deps.ts";
import type { Clock } from "../domain/clock.ts";
import type { Logger } from "../http/logger.ts";
import type { Resolver } from "../modules/webhooks/address.ts";
import { onEnqueue } from "../modules/webhooks/enqueue.ts";
import { announceExpiries } from "../modules/webhooks/expiries.ts";
import { purgeFinishedDeliveries } from "../modules/webhooks/retention.ts";
import { cancelPending } from "../modules/webhooks/service.ts";
import { ATTEMPT_TIMEOUT_MS, type AttemptResult, WebhookSender } from "./webhook-attempt.ts";
import {
  type ClaimedRow,
  dispatchStatements,
  loadClaimed,
  queueDepth,
  recordAttempt,
  WEBHOOK_RETRY_DELAYS_SEC,
} from "./webhook-queue.ts";

export { RETRY_JITTER, WEBHOOK_RETRY_DELAYS_SEC } from "./webhook-queue.ts";

export const PER_ENDPOINT_CONCURRENCY = 2;
export const GLOBAL_CONCURRENCY = 16;
/**
 * A claim outlives its attempt's timeout by this much; then a claim left by a dead process is due
 * again. The timeout bounds the whole attempt, DNS included (webhook-attempt.ts), so a live
 * process's claim never lapses while its attempt runs.
 */
export const CLAIM_MARGIN_MS = 15_000;
const POLL_MS = 1_000;
const EXPIRY_SCAN_MS = 30_000;
const PURGE_MS = 3_600_000;

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
}

/**
 * Delivers the webhook outbox (DESIGN §5): at least once, in the order events were queued per
 * endpoint, with Standard Webhooks signatures, retries with jitter, no redirects, a timeout per
 * attempt, and at most a few attempts in flight per endpoint so a slow receiver only slows itself.
 * Every attempt is logged; the row is the only state, so a restart continues where it stopped.
 */
export class WebhookDispatcher {
  private readonly clock: Clock;
  private readonly sender: WebhookSender;
  private readonly retryDelays: readonly number[];
  private readonly inFlight = new Map<string, number>();
  /** Deliveries this process is attempting: never claimed again by it, whatever the clock says. */
  private readonly attempting = new Set<string>();
  private readonly running = new Set<Promise<void>>();
  private total = 0;
  /** How each endpoint's last attempt by this process went (true: failed). */
  private readonly lastFailed = new Map<string, boolean>();
  /** When this process last claimed for each endpoint, as a count of claims: failing ones take turns by it. */
  private readonly lastTried = new Map<string, number>();
  private tries = 0;
  private readonly statements: ReturnType<typeof dispatchStatements>;
  /** Attempts in flight to failing endpoints: at most half the pool (see dispatchDue). */
  private failingTotal = 0;
  /** Set by start(): claims more at once when an attempt gives its slot back. */
  private wake: (() => void) | null = null;
  private stopped = false;
  /** Counters for /metrics. */
  readonly counters = { attempts: 0, failedAttempts: 0, failedDeliveries: 0, disabledEndpoints: 0 };

  constructor(
    private readonly deps: Pick<Deps, "sqlite" | "clock" | "secrets" | "ids">,
    private readonly options: DispatcherOptions,
  ) {
    this.clock = options.clock ?? deps.clock;
    this.sender = new WebhookSender(deps.secrets, options);
    this.retryDelays = options.retryDelaysSec ?? WEBHOOK_RETRY_DELAYS_SEC;
    this.statements = dispatchStatements(deps.sqlite);
  }

  /** Claims every due delivery there is room for and waits for those attempts; resolves with how many were made. */
  async runOnce(): Promise<number> {
    const started = this.dispatchDue();
    await Promise.all(started);
    return started.length;
  }

  /** Waits until nothing is in flight (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.running.size > 0) await Promise.all([...this.running]);
  }

  /** Polls and reacts to new events at once. The returned stop waits (bounded) for attempts in flight. */
  start(): () => Promise<void> {
    const kick = () => {
      if (this.stopped) return;
      try {
        this.dispatchDue();
      } catch (error) {
        this.options.logger.log("error", "webhook dispatch failed", { error: (error as Error).message });
      }
    };
    let purgedAt = 0;
    let purging = false;
    const purgeFailed = (error: Error) =>
      this.options.logger.log("error", "webhook delivery purge failed", { error: error.message });
    let scanning = false;
    // One chunk of the expiry scan per turn of the event loop (expiries.ts says why).
    const announce = () => {
      if (this.stopped) {
        scanning = false;
        return;
      }
      try {
        const { queued, more } = announceExpiries(this.deps, { leaseScanChunk: this.options.leaseScanChunk });
        if (queued > 0) kick();
        scanning = more;
        if (more) setImmediate(announce);
      } catch (error) {
        scanning = false;
        this.options.logger.log("error", "webhook expiry scan failed", { error: (error as Error).message });
      }
    };
    const scan = () => {
      try {
        if (!scanning) {
          scanning = true;
          announce();
        }
        if (!purging && Date.now() - purgedAt >= PURGE_MS) {
          purgedAt = Date.now();
          purging = true;
          // Chunk by chunk until the backlog is gone (retention.ts); one pass at a time.
          purgeFinishedDeliveries(this.deps, { stopped: () => this.stopped })
            .catch(purgeFailed)
            .finally(() => {
              purging = false;
            });
        }
      } catch (error) {
        purgeFailed(error as Error);
      }
    };
    // A slot given back is filled at once, not at the next poll (which made a receiver that
    // answers in a millisecond get two deliveries a second), once per turn however many finish.
    let woken = false;
    this.wake = () => {
      if (woken) return;
      woken = true;
      setImmediate(() => {
        woken = false;
        kick();
      });
    };
    const unsubscribe = onEnqueue(this.deps.sqlite, kick);
    const poll = setInterval(kick, this.options.pollMs ?? POLL_MS);
    const scanner = setInterval(scan, this.options.expiryScanMs ?? EXPIRY_SCAN_MS);
    poll.unref?.();
    scanner.unref?.();
    scan();
    kick();
    return async () => {
      this.stopped = true;
      this.wake = null;
      unsubscribe();
      clearInterval(poll);
      clearInterval(scanner);
      // An attempt cut off here stays claimed and is due again once its claim lapses.
      await Promise.race([this.idle(), Bun.sleep(5_000)]);
    };
  }

  /** Deliveries waiting (pending, or claimed and in flight): the queue depth for /metrics. */
  queueDepth(): number {
    return queueDepth(this.deps.sqlite);
  }

  /** Prometheus lines for the metrics registry. */
  metricLines(): string[] {
    return [
      "# HELP licensing_webhook_queue_depth Webhook deliveries waiting to be made (pending or in flight).",
      "# TYPE licensing_webhook_queue_depth gauge",
      `licensing_webhook_queue_depth ${this.queueDepth()}`,
      "# HELP licensing_webhook_attempts_total Webhook delivery attempts made by this process.",
      "# TYPE licensing_webhook_attempts_total counter",
      `licensing_webhook_attempts_total ${this.counters.attempts}`,
      "# HELP licensing_webhook_failures_total Webhook attempts that failed (error, timeout, non-2xx, refused address).",
      "# TYPE licensing_webhook_failures_total counter",
      `licensing_webhook_failures_total ${this.counters.failedAttempts}`,
      "# HELP licensing_webhook_deliveries_failed_total Webhook deliveries given up after the last retry.",
      "# TYPE licensing_webhook_deliveries_failed_total counter",
      `licensing_webhook_deliveries_failed_total ${this.counters.failedDeliveries}`,
    ];
  }

  private dispatchDue(): Promise<void>[] {
    const now = this.clock.now().getTime();
    const perEndpoint = this.options.perEndpointConcurrency ?? PER_ENDPOINT_CONCURRENCY;
    const global = this.options.globalConcurrency ?? GLOBAL_CONCURRENCY;
    // Receivers that fail (hang until the timeout, refuse, answer 5xx) get one attempt at a time
    // each, and at most half the pool together: eight endpoints that hang could otherwise hold all
    // sixteen slots for 10 s at a time, and every healthy endpoint would wait behind them.
    const failingShare = Math.max(1, Math.floor(global / 2));
    const s = this.statements;
    // Each endpoint's oldest due delivery, a seek each (this runs whenever an attempt ends); and
    // the deliveries whose claim lapsed (a process that died mid-attempt), few by nature.
    const oldest = new Map<string, number>();
    for (const { id } of s.endpoints.all()) {
      const at = s.oldestPending.get(id, now)?.at;
      if (at !== undefined) oldest.set(id, at);
    }
    for (const { endpoint_id: id, at } of s.lapsedByEndpoint.all(now))
      oldest.set(id, Math.min(at, oldest.get(id) ?? at));
    // Healthy endpoints first, the one waiting longest first; failing ones after them, taking turns
    // (the one this process tried least recently first), so a failing endpoint's backlog never
    // keeps its slot from another.
    const failing = (id: string) => this.lastFailed.get(id) === true;
    const rank = (id: string, at: number): [number, number, number] =>
      failing(id) ? [1, this.lastTried.get(id) ?? 0, at] : [0, at, 0];
    const order = [...oldest]
      .map(([id, at]) => ({ id, rank: rank(id, at) }))
      .sort((x, y) => x.rank[0] - y.rank[0] || x.rank[1] - y.rank[1] || x.rank[2] - y.rank[2]);
    const started: Promise<void>[] = [];
    // Derived from the attempt's timeout, never set apart from it: a claim shorter than the attempt
    // would let another process send a second copy while the first is still on its way.
    const claimMs = (this.options.timeoutMs ?? ATTEMPT_TIMEOUT_MS) + CLAIM_MARGIN_MS;
    for (const { id: endpointId } of order) {
      const isFailing = failing(endpointId);
      const room = Math.min(
        (isFailing ? 1 : perEndpoint) - (this.inFlight.get(endpointId) ?? 0),
        global - this.total,
        isFailing ? failingShare - this.failingTotal : global,
      );
      if (room <= 0) continue;
      const due = [...s.pendingDue.all(endpointId, now, room), ...s.lapsedDue.all(endpointId, now, room)]
        .sort((x, y) => x.at - y.at || (x.id < y.id ? -1 : x.id > y.id ? 1 : 0))
        .slice(0, room);
      for (const { id } of due) {
        // Its own attempt still running (the store clock moved past the claim, as the test clock
        // can): claiming it again would send a second copy in parallel.
        if (this.attempting.has(id)) continue;
        if (s.claim.run(now, now + claimMs, now, id).changes !== 1) continue;
        this.lastTried.set(endpointId, ++this.tries);
        started.push(this.track(endpointId, id, isFailing, this.attempt(id)));
      }
    }
    return started;
  }

  private track(endpointId: string, id: string, failing: boolean, work: Promise<void>): Promise<void> {
    this.inFlight.set(endpointId, (this.inFlight.get(endpointId) ?? 0) + 1);
    this.attempting.add(id);
    this.total++;
    if (failing) this.failingTotal++;
    const done = work
      .catch((error: Error) =>
        this.options.logger.log("error", "webhook attempt failed unexpectedly", { error: error.message }),
      )
      .finally(() => {
        const left = (this.inFlight.get(endpointId) ?? 1) - 1;
        if (left > 0) this.inFlight.set(endpointId, left);
        else this.inFlight.delete(endpointId);
        this.attempting.delete(id);
        this.total--;
        if (failing) this.failingTotal--;
        this.running.delete(done);
        this.wake?.();
      });
    this.running.add(done);
    return done;
  }

  private async attempt(id: string): Promise<void> {
    const row = loadClaimed(this.deps.sqlite, id);
    if (!row) return;
    const startedAt = this.clock.now();
    if (row.endpoint_status !== "active") {
      cancelPending(this.deps, row.endpoint_id, startedAt);
      return;
    }
    const began = performance.now();
    const result = await this.sender.send(row, startedAt);
    const durationMs = Math.round(performance.now() - began);
    this.record(row, result, startedAt, durationMs);
  }

  private record(row: ClaimedRow, result: AttemptResult, startedAt: Date, durationMs: number): void {
    const now = this.clock.now().getTime();
    this.lastFailed.set(row.endpoint_id, result.outcome !== "succeeded");
    const { number, status, error } = recordAttempt(
      this.deps,
      { row, result, startedAt, durationMs, now },
      { delaysSec: this.retryDelays, random: this.options.random ?? Math.random },
      this.counters,
    );
    if (result.outcome === "refused" && result.detail !== undefined) {
      // The address behind a refused host, for the operator: never in the delivery log (address.ts).
      this.options.logger.log("debug", "webhook address refused", {
        delivery_id: row.id,
        webhook_id: row.endpoint_id,
        detail: result.detail,
      });
    }
    if (result.outcome !== "succeeded") {
      // Never the URL: for team chat it is a secret.
      this.options.logger.log("warn", "webhook attempt failed", {
        delivery_id: row.id,
        webhook_id: row.endpoint_id,
        attempt: number,
        status: result.status,
        error,
        next: status,
      });
    }
  }
}
