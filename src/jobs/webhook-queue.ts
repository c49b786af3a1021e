import type { Deps } from "../deps.ts";
import { cancelPending } from "../modules/webhooks/service.ts";
import type { AttemptResult, AttemptRow } from "./webhook-attempt.ts";

/**
 * The webhook outbox as the dispatcher reads and writes it: the queries that find and claim due
 * deliveries, the row an attempt is made from, and what an attempt's outcome does to the store
 * (the attempt logged; the delivery succeeded, failed or put back with a jittered retry delay; the
 * endpoint disabled when its receiver answers 410). Apart from webhook-dispatcher.ts, which
 * decides which endpoint gets a slot and when, so the fairness rules read without the SQL.
 */

/** Seconds before the 1st … 7th retry (DESIGN §5); after the last, the delivery is failed (~28 h in all). */
export const WEBHOOK_RETRY_DELAYS_SEC = [5, 300, 1800, 7200, 18_000, 36_000, 36_000];
/** Each delay is stretched or shrunk by up to this fraction, so retries of many events do not arrive in lockstep. */
export const RETRY_JITTER = 0.1;

export interface ClaimedRow extends AttemptRow {
  id: string;
  environment: string;
  attempts: number;
  schedule_start: number;
  endpoint_status: "active" | "disabled" | "stopped";
}

/** Counters for /metrics, of this process's attempts; the dispatcher holds them. */
export interface DeliveryCounters {
  attempts: number;
  failedAttempts: number;
  failedDeliveries: number;
  disabledEndpoints: number;
}

/** When a failed delivery is tried again: the delays (WEBHOOK_RETRY_DELAYS_SEC) and the jitter's source. */
export interface RetrySchedule {
  delaysSec: readonly number[];
  /** A number in [0, 1). */
  random: () => number;
}

/** One attempt as it was made, to be recorded. */
export interface MadeAttempt {
  row: ClaimedRow;
  result: AttemptResult;
  startedAt: Date;
  durationMs: number;
  /** The store clock when the attempt ended, in ms. */
  now: number;
}

/** What recording an attempt did, for the dispatcher's log. */
export interface RecordedAttempt {
  /** The attempt's number, counting every attempt of the delivery. */
  number: number;
  /** The delivery's status after it (see recordAttempt for one cancelled or replayed meanwhile). */
  status: "succeeded" | "failed" | "pending" | "cancelled";
  error: string | null;
}

/*
 * "Due" in the queries below: pending and its time has come, or claimed by an attempt whose claim
 * lapsed (a process that died mid-attempt).
 */

export interface DueRow {
  id: string;
  at: number;
}

/** The dispatcher's reads and its claim, each by index (webhook_deliveries_endpoint_due, _due). */
export function dispatchStatements(sqlite: Deps["sqlite"]) {
  return {
    // Active endpoints only, found by webhook_endpoints_status, and each one's oldest due delivery
    // by a seek: a pass runs every second and whenever an attempt ends, so it must cost what can be
    // sent (at most the plan's endpoints), never every endpoint ever stopped or disabled. Their
    // queued deliveries were cancelled in the transaction that ended them (service.ts, a 410).
    // Grouping the due rows by endpoint instead reads every due row: 18 ms at 50,000 (0039).
    // `at` is null for an endpoint with nothing due (a filter on it would run the seek twice).
    oldestDue: sqlite.query<{ id: string; at: number | null }, [number]>(
      `SELECT w.id, (SELECT d.next_attempt_at FROM webhook_deliveries d
         WHERE d.endpoint_id = w.id AND d.status = 'pending' AND d.next_attempt_at <= ?1
         ORDER BY d.next_attempt_at LIMIT 1) AS at
       FROM webhook_endpoints w WHERE w.status = 'active'`,
    ),
    lapsedByEndpoint: sqlite.query<{ endpoint_id: string; at: number }, [number]>(
      `SELECT endpoint_id, min(next_attempt_at) AS at FROM webhook_deliveries
       WHERE status = 'delivering' AND claimed_until <= ?1 GROUP BY endpoint_id`,
    ),
    pendingDue: sqlite.query<DueRow, [string, number, number]>(
      `SELECT id, next_attempt_at AS at FROM webhook_deliveries
       WHERE endpoint_id = ?1 AND status = 'pending' AND next_attempt_at <= ?2 ORDER BY next_attempt_at, id LIMIT ?3`,
    ),
    lapsedDue: sqlite.query<DueRow, [string, number, number]>(
      `SELECT id, next_attempt_at AS at FROM webhook_deliveries
       WHERE endpoint_id = ?1 AND status = 'delivering' AND claimed_until <= ?2 ORDER BY next_attempt_at, id LIMIT ?3`,
    ),
    claim: sqlite.query<unknown, [number, number, number, string]>(
      `UPDATE webhook_deliveries SET status = 'delivering', claimed_until = ?2, updated_at = ?3
       WHERE id = ?4 AND
         ((status = 'pending' AND next_attempt_at <= ?1) OR (status = 'delivering' AND claimed_until <= ?1))`,
    ),
  };
}

/** A claimed delivery with its event and endpoint, all an attempt needs; null when it no longer exists. */
export function loadClaimed(sqlite: Deps["sqlite"], id: string): ClaimedRow | null {
  return sqlite
    .query<ClaimedRow, [string]>(
      `SELECT d.id, d.endpoint_id, d.event_id, d.environment, d.attempts, d.schedule_start, e.payload,
           w.kind, w.url_ciphertext, w.status AS endpoint_status, w.secret_ciphertext,
           w.previous_secret_ciphertext, w.previous_secret_expires_at
         FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id
         JOIN webhook_endpoints w ON w.id = d.endpoint_id WHERE d.id = ?`,
    )
    .get(id);
}

/** Deliveries waiting (pending, or claimed and in flight): the queue depth for /metrics. */
export function queueDepth(sqlite: Deps["sqlite"]): number {
  return (
    sqlite
      .query<{ n: number }, []>(
        "SELECT count(*) AS n FROM webhook_deliveries WHERE status IN ('pending', 'delivering')",
      )
      .get()?.n ?? 0
  );
}

/**
 * Logs the attempt and moves its delivery on, in one transaction: succeeded; failed after the last
 * retry or on a 410 (which also disables the endpoint and cancels its other deliveries); else
 * pending again after the next retry delay. Counts it in `counters`.
 *
 * A delivery no longer claimed when the attempt ends was cancelled meanwhile (its endpoint
 * stopped, or disabled by a 410 to another delivery) or, after that, replayed. The attempt counts
 * all the same (`attempts`, the last status and error), so the delivery never shows fewer attempts
 * than its log. A 2xx makes a cancelled delivery succeeded: the receiver has it. Anything else
 * leaves it cancelled, not retried (its endpoint takes nothing more); a replayed one stays queued
 * with its fresh schedule starting after this attempt.
 */
export function recordAttempt(
  deps: Pick<Deps, "sqlite" | "ids">,
  attempt: MadeAttempt,
  retries: RetrySchedule,
  counters: DeliveryCounters,
): RecordedAttempt {
  const { row, result, startedAt, durationMs, now } = attempt;
  const number = row.attempts + 1;
  counters.attempts++;
  if (result.outcome !== "succeeded") counters.failedAttempts++;
  const retryIndex = number - row.schedule_start - 1;
  const delaySec = retries.delaysSec[retryIndex];
  let status: RecordedAttempt["status"];
  let next = now;
  if (result.outcome === "succeeded") status = "succeeded";
  else if (result.outcome === "failed" && result.gone) status = "failed";
  else if (delaySec === undefined) status = "failed";
  else {
    status = "pending";
    const jitter = 1 + (retries.random() * 2 - 1) * RETRY_JITTER;
    next = now + Math.round(delaySec * 1000 * jitter);
  }
  const error = result.outcome === "succeeded" ? null : result.error;
  deps.sqlite
    .transaction(() => {
      deps.sqlite
        .query<unknown, [string, string, number, number, number, string, number | null, string | null]>(
          `INSERT INTO webhook_attempts (id, delivery_id, number, started_at, duration_ms, outcome, response_status, error)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
        )
        .run(
          `wha_${deps.ids.ulid(now)}`,
          row.id,
          number,
          startedAt.getTime(),
          durationMs,
          result.outcome,
          result.status,
          error,
        );
      const claimed = deps.sqlite
        .query<
          unknown,
          [string, number, number, number | null, string | null, number, number | null, string]
        >(
          `UPDATE webhook_deliveries SET status = ?, attempts = ?, next_attempt_at = ?, last_response_status = ?,
             last_error = ?, updated_at = ?, completed_at = ?, claimed_until = NULL
           WHERE id = ? AND status = 'delivering'`,
        )
        .run(status, number, next, result.status, error, now, status === "pending" ? null : now, row.id);
      if (claimed.changes === 0) {
        // Cancelled meanwhile, or replayed after that (see above); counted on top of the attempts
        // recorded since the claim, if any. Every SET reads the row as it was.
        const after = deps.sqlite
          .query<
            { status: RecordedAttempt["status"] },
            [number, number | null, string | null, number, string]
          >(
            `UPDATE webhook_deliveries SET attempts = attempts + 1, last_response_status = ?2, last_error = ?3,
               updated_at = ?4,
               status = CASE WHEN status = 'cancelled' AND ?1 THEN 'succeeded' ELSE status END,
               completed_at = CASE WHEN status = 'cancelled' AND ?1 THEN ?4 ELSE completed_at END,
               schedule_start = CASE WHEN status = 'pending' THEN attempts + 1 ELSE schedule_start END
             WHERE id = ?5 RETURNING status`,
          )
          .get(result.outcome === "succeeded" ? 1 : 0, result.status, error, now, row.id);
        status = after?.status ?? "cancelled";
      }
      if (result.outcome === "failed" && result.gone) {
        // A stopped endpoint stays stopped (a 410 to a delivery cancelled by its stop).
        const disabled = deps.sqlite
          .query<unknown, [number, string]>(
            `UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = 'gone', updated_at = ?,
               revision = revision + 1 WHERE id = ? AND status = 'active'`,
          )
          .run(now, row.endpoint_id).changes;
        cancelPending(deps, row.endpoint_id, new Date(now));
        if (disabled > 0) counters.disabledEndpoints++;
      }
    })
    .immediate();
  if (status === "failed") counters.failedDeliveries++;
  return { number, status, error };
}
