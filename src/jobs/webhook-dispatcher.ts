import type { Deps } from "../deps.ts";
import type { Clock } from "../domain/clock.ts";
import { onEnqueue } from "../modules/webhooks/enqueue.ts";
import { announceExpiries } from "../modules/webhooks/expiries.ts";
import { purgeFinishedDeliveries } from "../modules/webhooks/retention.ts";
import { cancelPending } from "../modules/webhooks/service.ts";
import { RepeatedFailureLog } from "./repeated-failure-log.ts";
import { ATTEMPT_TIMEOUT_MS, type AttemptResult, WebhookSender } from "./webhook-attempt.ts";
import {
  CLAIM_MARGIN_MS,
  type DispatcherOptions,
  GLOBAL_CONCURRENCY,
  PER_ENDPOINT_CONCURRENCY,
  SLOW_ATTEMPT_MS,
} from "./webhook-dispatch-options.ts";
import {
  type ClaimedRow,
  type DueRow,
  dispatchStatements,
  loadClaimed,
  queueDepth,
  recordAttempt,
  WEBHOOK_RETRY_DELAYS_SEC,
} from "./webhook-queue.ts";

export { RETRY_JITTER, WEBHOOK_RETRY_DELAYS_SEC } from "./webhook-queue.ts";

const POLL_MS = 1_000;
const EXPIRY_SCAN_MS = 30_000;
const PURGE_MS = 3_600_000;

/** An endpoint with deliveries due, in one pass. */
interface Candidate {
  id: string;
  /** When its oldest due delivery became due. */
  at: number;
  /** Its due deliveries, oldest first, read when it first gets a slot in the pass. */
  due: DueRow[] | null;
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
  /**
   * Endpoints whose last attempt by this process failed or was slow: one attempt at a time each,
   * and at most half the pool together (see dispatchDue).
   */
  private readonly limited = new Set<string>();
  /** When this process last claimed for each endpoint, as a count of claims: limited ones take turns by it. */
  private readonly lastTried = new Map<string, number>();
  private tries = 0;
  private readonly statements: ReturnType<typeof dispatchStatements>;
  /** Attempts in flight to limited endpoints. */
  private limitedTotal = 0;
  private readonly perEndpoint: number;
  private readonly global: number;
  /** The slots limited endpoints may hold together: half the pool. */
  private readonly limitedShare: number;
  /** Set by start(): claims more at once when an attempt gives its slot back. */
  private wake: (() => void) | null = null;
  private stopped = false;
  private readonly dispatchFailures: RepeatedFailureLog;
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
    this.perEndpoint = options.perEndpointConcurrency ?? PER_ENDPOINT_CONCURRENCY;
    this.global = options.globalConcurrency ?? GLOBAL_CONCURRENCY;
    this.limitedShare = Math.max(1, Math.floor(this.global / 2));
    this.dispatchFailures = new RepeatedFailureLog(options.logger, {
      failed: "webhook dispatch failed",
      recovered: "webhook dispatch recovered",
      nowMs: options.monotonicMs,
    });
  }

  /** Claims every due delivery there is room for and waits for those attempts; resolves with how many were made. */
  async runOnce(): Promise<number> {
    const started = this.dispatchDue();
    await Promise.all(started);
    return started.length;
  }

  /**
   * A pass as the running dispatcher makes one, on every wake-up: what fails (a full disk fails the
   * claims) is logged rather than thrown, and while it goes on failing, at most once a minute.
   */
  dispatchPass(): void {
    try {
      this.dispatchDue();
    } catch (error) {
      this.dispatchFailures.failed(error);
      return;
    }
    this.dispatchFailures.succeeded();
  }

  /** Waits until nothing is in flight (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.running.size > 0) await Promise.all([...this.running]);
  }

  /** Polls and reacts to new events at once. The returned stop waits (bounded) for attempts in flight. */
  start(): () => Promise<void> {
    const kick = () => {
      if (!this.stopped) this.dispatchPass();
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

  /** Endpoints this process keeps a turn and a slowness mark for: the active ones, and those in flight. */
  get trackedEndpointCount(): number {
    return this.lastTried.size;
  }

  /**
   * Drops what this process remembers of endpoints that are no longer active (stopped, disabled)
   * and have nothing in flight: they never receive again, and a process that has tried many
   * endpoints over its life would otherwise keep every one.
   */
  private forgetInactive(active: Set<string>): void {
    for (const id of this.lastTried.keys()) {
      if (active.has(id) || this.inFlight.has(id)) continue;
      this.lastTried.delete(id);
      this.limited.delete(id);
    }
  }

  private dispatchDue(): Promise<void>[] {
    const now = this.clock.now().getTime();
    const s = this.statements;
    // Each active endpoint's oldest due delivery (one statement, a seek each); and the deliveries
    // whose claim lapsed (a process that died mid-attempt), few by nature.
    const oldest = new Map<string, number>();
    const active = new Set<string>();
    for (const { id, at } of s.oldestDue.all(now)) {
      active.add(id);
      if (at !== null) oldest.set(id, at);
    }
    this.forgetInactive(active);
    for (const { endpoint_id: id, at } of s.lapsedByEndpoint.all(now))
      oldest.set(id, Math.min(at, oldest.get(id) ?? at));
    const quick: Candidate[] = [];
    const limited: Candidate[] = [];
    for (const [id, at] of oldest) (this.limited.has(id) ? limited : quick).push({ id, at, due: null });
    // Quick endpoints first, the one waiting longest first, in rounds: each gets a slot before any
    // gets a second, so endpoints that are slow before this process has seen them be slow never
    // take the whole pool. Limited ones after them, taking turns (the one this process tried least
    // recently first), so a backlog never keeps its slot from another.
    quick.sort((x, y) => x.at - y.at);
    limited.sort((x, y) => (this.lastTried.get(x.id) ?? 0) - (this.lastTried.get(y.id) ?? 0) || x.at - y.at);
    const started: Promise<void>[] = [];
    for (let round = 1; round <= this.perEndpoint; round++) {
      for (const candidate of quick) this.claimNext(candidate, round, now, started);
    }
    for (const candidate of limited) this.claimNext(candidate, 1, now, started);
    return started;
  }

  /**
   * Claims the endpoint's oldest due delivery and starts its attempt, if the endpoint has fewer
   * than `upTo` attempts in flight (1 when limited) and the pool (for a limited endpoint, the
   * limited share of it) has a slot.
   */
  private claimNext(candidate: Candidate, upTo: number, now: number, started: Promise<void>[]): void {
    const endpointId = candidate.id;
    const isLimited = this.limited.has(endpointId);
    if ((this.inFlight.get(endpointId) ?? 0) >= (isLimited ? 1 : upTo)) return;
    if (this.total >= this.global || (isLimited && this.limitedTotal >= this.limitedShare)) return;
    const s = this.statements;
    // Read at most once a pass, as many as the endpoint could take, oldest first.
    candidate.due ??= [
      ...s.pendingDue.all(endpointId, now, this.perEndpoint),
      ...s.lapsedDue.all(endpointId, now, this.perEndpoint),
    ].sort((x, y) => x.at - y.at || (x.id < y.id ? -1 : x.id > y.id ? 1 : 0));
    // Derived from the attempt's timeout, never set apart from it: a claim shorter than the attempt
    // would let another process send a second copy while the first is still on its way.
    const claimMs = (this.options.timeoutMs ?? ATTEMPT_TIMEOUT_MS) + CLAIM_MARGIN_MS;
    for (let next = candidate.due.shift(); next; next = candidate.due.shift()) {
      // Its own attempt still running (the store clock moved past the claim, as the test clock
      // can): claiming it again would send a second copy in parallel.
      if (this.attempting.has(next.id)) continue;
      if (s.claim.run(now, now + claimMs, now, next.id).changes !== 1) continue;
      this.lastTried.set(endpointId, ++this.tries);
      started.push(this.track(endpointId, next.id, isLimited, this.attempt(next.id)));
      return;
    }
  }

  private track(endpointId: string, id: string, limited: boolean, work: Promise<void>): Promise<void> {
    this.inFlight.set(endpointId, (this.inFlight.get(endpointId) ?? 0) + 1);
    this.attempting.add(id);
    this.total++;
    if (limited) this.limitedTotal++;
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
        if (limited) this.limitedTotal--;
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
    const timer = this.options.monotonicMs ?? (() => performance.now());
    const began = timer();
    const result = await this.sender.send(row, startedAt);
    const durationMs = Math.round(timer() - began);
    this.record(row, result, startedAt, durationMs);
  }

  private record(row: ClaimedRow, result: AttemptResult, startedAt: Date, durationMs: number): void {
    const now = this.clock.now().getTime();
    const slow = durationMs >= (this.options.slowAttemptMs ?? SLOW_ATTEMPT_MS);
    if (result.outcome !== "succeeded" || slow) this.limited.add(row.endpoint_id);
    else this.limited.delete(row.endpoint_id);
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
