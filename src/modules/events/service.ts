import type { Database } from "bun:sqlite";
import { and, desc, eq, lt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import type { Environment } from "../../domain/scopes.ts";
import type { PageRequest } from "../../http/pagination.ts";
import type { Db } from "../../store/db.ts";
import { auditEvents } from "../../store/schema/index.ts";
import { enqueuePayload } from "../webhooks/enqueue.ts";

/** A transaction handle or the database itself: audit rows are written inside the change's transaction. */
type Writer = Pick<Db, "insert">;

export interface AuditEntry {
  type: string;
  target: { type: string; id: string };
  data?: Record<string, unknown>;
}

/**
 * Records one audit event; call it inside the transaction that makes the change. The event is
 * queued for webhook endpoints subscribed to its type in that same transaction (same connection).
 */
export function recordAudit(
  writer: Writer,
  deps: Pick<Deps, "clock" | "ids"> & Partial<Pick<Deps, "sqlite">>,
  ctx: ChangeContext,
  entry: AuditEntry,
): void {
  const row = writeAuditRow(writer, deps, ctx, entry);
  // Every caller passes the full Deps; some declare a narrower type, so the connection is looked up.
  const sqlite = deps.sqlite ?? (writer as { $client?: Database }).$client;
  if (!sqlite) throw new Error("recordAudit needs deps.sqlite to queue the event for webhooks");
  enqueuePayload({ clock: deps.clock, ids: deps.ids, sqlite }, entry.type, () => ({
    environment: ctx.environment,
    data: presentAuditEvent(row),
  }));
}

/** The audit row alone, queued for no endpoint: for a change whose live copy is the one delivered. */
function writeAuditRow(
  writer: Writer,
  deps: Pick<Deps, "clock" | "ids">,
  ctx: ChangeContext,
  entry: AuditEntry,
): AuditEventRow {
  const now = deps.clock.now();
  const row: AuditEventRow = {
    id: deps.ids.next("event", now.getTime()),
    environment: ctx.environment,
    type: entry.type,
    actor: ctx.actor,
    targetType: entry.target.type,
    targetId: entry.target.id,
    data: entry.data ?? {},
    requestId: ctx.requestId,
    createdAt: now,
  };
  writer.insert(auditEvents).values(row).run();
  return row;
}

/**
 * The audit event of a change to a record both environments share (customers, resellers, webhook
 * endpoints): in the acting key's environment, and, when a test key acted, in the live one too. A
 * test key (kept on CI runners and developers' machines) may change what live keys rely on, and
 * the live audit log, with its webhooks, must show that it did and which key it was.
 *
 * One change is one delivery per endpoint: every endpoint receives both environments' events, so
 * queueing both copies would reach each receiver twice under two `webhook-id`s, and a receiver
 * deduplicating on that id (docs/api.md "Delivery") would act twice.
 */
export function recordSharedAudit(
  writer: Writer,
  deps: Pick<Deps, "clock" | "ids"> & Partial<Pick<Deps, "sqlite">>,
  ctx: ChangeContext,
  entry: AuditEntry,
): void {
  if (ctx.environment === "test") recordInBothEnvironments(writer, deps, ctx, entry);
  else recordAudit(writer, deps, ctx, entry);
}

/**
 * One change both audit logs show (a test key's change to a shared record, a plan change), queued
 * once for webhooks: as the live event, the one live receivers rely on. The test copy is written
 * first, stays in the test audit log and is delivered to no endpoint.
 */
export function recordInBothEnvironments(
  writer: Writer,
  deps: Pick<Deps, "clock" | "ids"> & Partial<Pick<Deps, "sqlite">>,
  ctx: Omit<ChangeContext, "environment">,
  entry: AuditEntry,
): void {
  writeAuditRow(writer, deps, { ...ctx, environment: "test" }, entry);
  recordAudit(writer, deps, { ...ctx, environment: "live" }, entry);
}

export type AuditEventRow = typeof auditEvents.$inferSelect;

export function presentAuditEvent(row: AuditEventRow) {
  return {
    id: row.id,
    type: row.type,
    request_id: row.requestId,
    actor: row.actor,
    target: { type: row.targetType, id: row.targetId, environment: row.environment },
    data: row.data,
    created_at: row.createdAt.toISOString(),
  };
}

export class AuditService {
  constructor(private readonly deps: Pick<Deps, "db">) {}

  /** Newest first, only the caller's environment. */
  list(environment: Environment, page: PageRequest): AuditEventRow[] {
    return this.deps.db
      .select()
      .from(auditEvents)
      .where(
        and(
          eq(auditEvents.environment, environment),
          page.before ? lt(auditEvents.id, page.before) : undefined,
        ),
      )
      .orderBy(desc(auditEvents.id))
      .limit(page.limit + 1)
      .all();
  }
}
