import type { Deps } from "../../deps.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { planHasWebhooks } from "./enqueue.ts";
import { planLacksWebhooks, type WebhookService } from "./service.ts";

interface DeliveryRow {
  id: string;
  endpoint_id: string;
  event_id: string;
  environment: Environment;
  event_type: string;
  status: "pending" | "delivering" | "succeeded" | "failed" | "cancelled";
  attempts: number;
  next_attempt_at: number;
  last_response_status: number | null;
  last_error: string | null;
  created_at: number;
  completed_at: number | null;
}

interface AttemptRow {
  number: number;
  started_at: number;
  duration_ms: number;
  outcome: "succeeded" | "failed" | "refused";
  response_status: number | null;
  error: string | null;
}

const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());

export function presentDelivery(row: DeliveryRow) {
  return {
    id: row.id,
    webhook_id: row.endpoint_id,
    message_id: row.event_id,
    event_type: row.event_type,
    environment: row.environment,
    status: row.status,
    attempts: row.attempts,
    next_attempt_at: row.status === "pending" ? iso(row.next_attempt_at) : null,
    last_response_status: row.last_response_status,
    last_error: row.last_error,
    created_at: iso(row.created_at) as string,
    completed_at: iso(row.completed_at),
  };
}

/**
 * The delivery log of an endpoint. An endpoint receives both environments' events, but a key reads
 * (and replays) only its own environment's deliveries: their payloads are that environment's data.
 */
export class DeliveryLog {
  constructor(
    private readonly deps: Pick<Deps, "sqlite" | "clock">,
    private readonly endpoints: WebhookService,
  ) {}

  list(endpointId: string, environment: Environment, page: PageRequest, status?: string) {
    this.endpoints.get(endpointId);
    const rows = this.deps.sqlite
      .query<DeliveryRow, [string, string, string, string | null, string | null, number]>(
        `SELECT id, endpoint_id, event_id, environment, event_type, status, attempts, next_attempt_at,
           last_response_status, last_error, created_at, completed_at FROM webhook_deliveries WHERE endpoint_id = ? AND environment = ? AND id < ?
         AND (? IS NULL OR status = ?) ORDER BY id DESC LIMIT ?`,
      )
      .all(endpointId, environment, page.before ?? "whd_~", status ?? null, status ?? null, page.limit + 1);
    return rows;
  }

  get(endpointId: string, deliveryId: string, environment: Environment) {
    this.endpoints.get(endpointId);
    const row = this.deps.sqlite
      .query<DeliveryRow & { payload: string }, [string, string, string]>(
        `SELECT d.id, d.endpoint_id, d.event_id, d.environment, d.event_type, d.status, d.attempts,
           d.next_attempt_at, d.last_response_status, d.last_error, d.created_at, d.completed_at, e.payload
         FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id
         WHERE d.id = ? AND d.endpoint_id = ? AND d.environment = ?`,
      )
      .get(deliveryId, endpointId, environment);
    if (!row) throw ApiError.notFound("delivery");
    const attempts = this.deps.sqlite
      .query<AttemptRow, [string]>(
        `SELECT number, started_at, duration_ms, outcome, response_status, error FROM webhook_attempts
         WHERE delivery_id = ? ORDER BY number`,
      )
      .all(deliveryId);
    return {
      ...presentDelivery(row),
      payload: JSON.parse(row.payload) as Record<string, unknown>,
      attempt_log: attempts.map((a) => ({ ...a, started_at: iso(a.started_at) as string })),
    };
  }

  /**
   * Sends a finished delivery again: the same message id and body, a fresh retry schedule. Only
   * for an active endpoint, and not while the delivery is still queued.
   */
  replay(endpointId: string, deliveryId: string, environment: Environment) {
    // Sending again is queueing again: without the plan's feature nothing is queued (enqueue.ts).
    if (!planHasWebhooks(this.deps.sqlite)) throw planLacksWebhooks();
    // The check and the update in one write transaction: a stop committed between them would
    // leave a pending delivery on an endpoint no dispatch pass reads.
    return this.deps.sqlite
      .transaction(() => this.replayChecked(endpointId, deliveryId, environment))
      .immediate();
  }

  private replayChecked(endpointId: string, deliveryId: string, environment: Environment) {
    const endpoint = this.endpoints.get(endpointId);
    const current = this.get(endpointId, deliveryId, environment);
    if (endpoint.status !== "active") {
      throw new ApiError("INVALID_TRANSITION", `The endpoint is ${endpoint.status}; it receives nothing.`, {
        endpoint_status: endpoint.status,
      });
    }
    if (current.status === "pending" || current.status === "delivering") {
      throw new ApiError("INVALID_TRANSITION", "The delivery is still queued; it needs no replay.", {
        from: current.status,
      });
    }
    const now = this.deps.clock.now().getTime();
    this.deps.sqlite
      .query<unknown, [number, number, string]>(
        `UPDATE webhook_deliveries SET status = 'pending', schedule_start = attempts, next_attempt_at = ?,
           updated_at = ?, completed_at = NULL, claimed_until = NULL WHERE id = ?`,
      )
      .run(now, now, deliveryId);
    return this.get(endpointId, deliveryId, environment);
  }

  /**
   * Cancels deliveries still queued on an endpoint that is stopped or disabled, from the sweeper.
   * Stopping or disabling cancels them in the same transaction, and a dispatch pass reads only
   * active endpoints; a store written by a version that did neither would keep such rows queued
   * for good (and in the queue depth). Returns how many went.
   */
  cancelOrphaned(): number {
    const now = this.deps.clock.now().getTime();
    return this.deps.sqlite
      .query<unknown, [number, number]>(
        `UPDATE webhook_deliveries SET status = 'cancelled', completed_at = ?1, updated_at = ?2, claimed_until = NULL
         WHERE status IN ('pending', 'delivering')
           AND endpoint_id IN (SELECT id FROM webhook_endpoints WHERE status <> 'active')`,
      )
      .run(now, now).changes;
  }
}
