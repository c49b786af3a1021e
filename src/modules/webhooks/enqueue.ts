import type { Database } from "bun:sqlite";
import type { Deps } from "../../deps.ts";
import { hasFeature, type PlanDefinition, storedPlan } from "../../domain/plans.ts";
import type { Environment } from "../../domain/scopes.ts";
import { subscribes } from "./catalogue.ts";

/**
 * The outbox side of webhooks. Call these inside the transaction that makes the change: they write
 * through the same SQLite connection, so the event commits or rolls back with the change, and a
 * crash can neither lose an event nor announce a change that never happened. With no active
 * endpoint subscribed, the cost is one cached prepared query and nothing is written.
 */
export type EnqueueDeps = Pick<Deps, "sqlite" | "clock" | "ids">;

export type WebhookActor =
  | { type: "api_key"; id: string; name: string }
  | { type: "cli"; id: string; uid?: number }
  | { type: "device" }
  | { type: "system" };

/** An event from outside the audit log: a device, a trial sign-up, the passing of time. */
export interface RuntimeEvent {
  environment: Environment;
  target: { type: string; id: string };
  actor?: WebhookActor;
  data?: Record<string, unknown>;
  requestId?: string | null;
}

interface EndpointRow {
  id: string;
  events: string;
}

interface Listeners {
  set: Set<() => void>;
  /** A call is scheduled: the events queued until it runs share it. */
  scheduled: boolean;
}

const kicks = new WeakMap<Database, Listeners>();

/**
 * The dispatcher listens here, so a new event goes out without waiting for the next poll. Called
 * once for however many events were queued in a turn of the event loop: each call is a dispatch
 * pass, and a request (an import, a bulk change) can queue hundreds.
 */
export function onEnqueue(sqlite: Database, listener: () => void): () => void {
  let listeners = kicks.get(sqlite);
  if (!listeners) {
    listeners = { set: new Set(), scheduled: false };
    kicks.set(sqlite, listeners);
  }
  const { set } = listeners;
  set.add(listener);
  return () => set.delete(listener);
}

function kickListeners(sqlite: Database): void {
  const listeners = kicks.get(sqlite);
  if (!listeners?.set.size || listeners.scheduled) return;
  listeners.scheduled = true;
  // After the caller's transaction has committed: the dispatcher must see the rows.
  setTimeout(() => {
    listeners.scheduled = false;
    for (const kick of listeners.set) kick();
  }, 0);
}

function subscribedEndpoints(sqlite: Database, type: string): string[] {
  const rows = sqlite
    .query<EndpointRow, []>("SELECT id, events FROM webhook_endpoints WHERE status = 'active'")
    .all();
  if (rows.length === 0 || !planHasWebhooks(sqlite)) return [];
  return rows.filter((row) => subscribes(JSON.parse(row.events) as string[], type)).map((row) => row.id);
}

/**
 * Read from the store at each event (only when an endpoint is active) and each endpoint change: a
 * plan changed by `licensing plan set` stops or resumes queueing at once. Deliveries queued before
 * stay due.
 */
export const planHasWebhooks = (sqlite: Database): boolean => hasFeature(planOf(sqlite), "webhooks");

/**
 * The workspace's plan as the store says now (a `licensing plan set` is seen at once), read as
 * WorkspaceService reads it, through this module's connection only (enqueue runs inside callers'
 * transactions with nothing but the SQLite handle).
 */
export function planOf(sqlite: Database): PlanDefinition {
  const row = sqlite.query<{ code: string }, []>("SELECT plan_code AS code FROM workspace LIMIT 1").get();
  return storedPlan(row?.code);
}

/** Endpoints that count toward the plan's `webhook_endpoints`: every one not stopped. */
export const countEndpoints = (sqlite: Database): number =>
  sqlite
    .query<{ n: number }, []>("SELECT count(*) AS n FROM webhook_endpoints WHERE status <> 'stopped'")
    .get()?.n ?? 0;

/** Whether any active endpoint would receive `type`; lets scans skip work nobody listens to. */
export const hasSubscriber = (sqlite: Database, type: string): boolean =>
  subscribedEndpoints(sqlite, type).length > 0;

/**
 * Queues `{ type, timestamp, environment, data }` for every active endpoint subscribed to `type`.
 * `data` is built only when someone listens. Returns the message id (`msg_…`), or null when no
 * endpoint wants the event.
 */
export function enqueuePayload(
  deps: EnqueueDeps,
  type: string,
  build: () => { environment: Environment; data: Record<string, unknown> } | null,
): string | null {
  const endpoints = subscribedEndpoints(deps.sqlite, type);
  if (endpoints.length === 0) return null;
  const event = build();
  if (!event) return null;
  const now = deps.clock.now();
  const ms = now.getTime();
  const id = `msg_${deps.ids.ulid(ms)}`;
  const payload = JSON.stringify({
    type,
    timestamp: now.toISOString(),
    environment: event.environment,
    data: event.data,
  });
  deps.sqlite
    .query<unknown, [string, string, string, string, number]>(
      "INSERT INTO webhook_events (id, environment, type, payload, created_at) VALUES (?, ?, ?, ?, ?)",
    )
    .run(id, event.environment, type, payload, ms);
  const insert = deps.sqlite.query<unknown, [string, string, string, string, string, number, number, number]>(
    `INSERT INTO webhook_deliveries (id, endpoint_id, event_id, environment, event_type, status, attempts,
       schedule_start, next_attempt_at, created_at, updated_at)
     VALUES (?, ?, ?, ?, ?, 'pending', 0, 0, ?, ?, ?)`,
  );
  for (const endpointId of endpoints) {
    insert.run(`whd_${deps.ids.ulid(ms)}`, endpointId, id, event.environment, type, ms, ms, ms);
  }
  kickListeners(deps.sqlite);
  return id;
}

/**
 * A runtime-side event, shaped like an audit event (docs/api.md "Webhook payload") so receivers
 * read every event the same way. Its `id` is an `evt_` id that the audit log does not list.
 */
export function enqueueEvent(
  deps: EnqueueDeps,
  type: string,
  event: RuntimeEvent | (() => RuntimeEvent | null),
): string | null {
  return enqueuePayload(deps, type, () => {
    const e = typeof event === "function" ? event() : event;
    if (!e) return null;
    const now = deps.clock.now();
    return {
      environment: e.environment,
      data: {
        id: deps.ids.next("event", now.getTime()),
        type,
        request_id: e.requestId ?? null,
        actor: e.actor ?? { type: "system" },
        target: { ...e.target, environment: e.environment },
        data: e.data ?? {},
        created_at: now.toISOString(),
      },
    };
  });
}

interface ActivationFacts {
  environment: Environment;
  product_id: string;
  license_id: string;
}

/** activation.created / activation.deactivated by a device (or culling); one line at the call site. */
export function enqueueActivationEvent(
  deps: EnqueueDeps,
  type: "activation.created" | "activation.deactivated",
  activationId: string,
  data: Record<string, unknown> = {},
): void {
  enqueueEvent(deps, type, () => {
    const row = deps.sqlite
      .query<ActivationFacts, [string]>(
        "SELECT environment, product_id, license_id FROM activations WHERE id = ?",
      )
      .get(activationId);
    if (!row) return null;
    return {
      environment: row.environment,
      actor: { type: "device" },
      target: { type: "activation", id: activationId },
      data: { license_id: row.license_id, product_id: row.product_id, ...data },
    };
  });
}
