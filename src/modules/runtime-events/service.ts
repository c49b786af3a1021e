import type { Database } from "bun:sqlite";
import { and, asc, eq, gt, gte } from "drizzle-orm";
import type { Deps } from "../../deps.ts";
import type { Environment } from "../../domain/scopes.ts";
import type { ErrorCode } from "../../http/errors.ts";
import { runtimeEvents } from "../../store/schema/index.ts";

export type RuntimeOperationName =
  | "activation_create"
  | "heartbeat"
  | "deactivation"
  | "lease_create"
  | "lease_heartbeat"
  | "lease_release";

export interface Rejection {
  environment: Environment;
  operation: RuntimeOperationName;
  code: ErrorCode;
  httpStatus: number;
  productId: string | null;
  licenseId?: string | null;
  activationId?: string | null;
  requestId: string;
}

const HOUR_MS = 3_600_000;
export const RETENTION_MS = 7 * 24 * HOUR_MS;
/**
 * Distinct entries an environment may add in one hour before the rest fold into overflow entries:
 * counted per environment, so a flood of test-key traffic never hides the live details.
 */
export const DISTINCT_ENTRIES_PER_HOUR = 500;

export type RuntimeEventRow = typeof runtimeEvents.$inferSelect;

/**
 * Rejected runtime requests, aggregated per (target, operation, code, hour) as spec §6.2 says.
 * Refusals by rate limits, and requests naming no known product or activation, are not recorded.
 */
export class RuntimeEventService {
  private readonly upsert;
  private readonly distinctThisHour;
  private readonly exists;

  constructor(private readonly deps: Pick<Deps, "db" | "sqlite" | "clock" | "ids">) {
    const sqlite: Database = deps.sqlite;
    this.upsert = sqlite.prepare<
      unknown,
      [
        string,
        string,
        number,
        string,
        string,
        number,
        string | null,
        string | null,
        string | null,
        number,
        number,
        number,
        string,
        string,
      ]
    >(
      `INSERT INTO runtime_events (id, environment, hour, operation, code, http_status, product_id, license_id, activation_id,
         details_omitted, occurrences, first_occurred_at, last_occurred_at, last_request_id, bucket)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)
       ON CONFLICT (bucket) DO UPDATE SET occurrences = occurrences + 1,
         last_occurred_at = excluded.last_occurred_at, last_request_id = excluded.last_request_id`,
    );
    this.distinctThisHour = sqlite.prepare<{ n: number }, [number, string]>(
      "SELECT count(*) AS n FROM runtime_events WHERE hour = ? AND environment = ? AND details_omitted = 0",
    );
    this.exists = sqlite.prepare<{ one: number }, [string]>(
      "SELECT 1 AS one FROM runtime_events WHERE bucket = ?",
    );
  }

  record(rejection: Rejection): void {
    if (rejection.code === "RATE_LIMITED") return;
    if (!rejection.productId && !rejection.activationId) return;
    const now = this.deps.clock.now();
    const hour = Math.floor(now.getTime() / HOUR_MS);
    const targets = [
      rejection.productId ?? null,
      rejection.licenseId ?? null,
      rejection.activationId ?? null,
    ] as const;
    let omitted = false;
    let bucket = [rejection.environment, hour, rejection.operation, rejection.code, ...targets, "0"].join(
      "|",
    );
    if (
      !this.exists.get(bucket) &&
      (this.distinctThisHour.get(hour, rejection.environment)?.n ?? 0) >= DISTINCT_ENTRIES_PER_HOUR
    ) {
      omitted = true;
      bucket = [rejection.environment, hour, rejection.operation, rejection.code, "", "", "", "1"].join("|");
    }
    const nowMs = now.getTime();
    this.upsert.run(
      this.deps.ids.next("event", nowMs),
      rejection.environment,
      hour,
      rejection.operation,
      rejection.code,
      rejection.httpStatus,
      omitted ? null : targets[0],
      omitted ? null : targets[1],
      omitted ? null : targets[2],
      omitted ? 1 : 0,
      nowMs,
      nowMs,
      rejection.requestId,
      bucket,
    );
  }

  /** Oldest first, within the last 7 days; `after` is the last id of the previous page. */
  list(
    environment: Environment,
    filter: { licenseId?: string; activationId?: string; productId?: string; since?: Date },
    page: { limit: number; after?: string },
  ): RuntimeEventRow[] {
    const floor = new Date(this.deps.clock.now().getTime() - RETENTION_MS);
    const since = filter.since && filter.since > floor ? filter.since : floor;
    return this.deps.db
      .select()
      .from(runtimeEvents)
      .where(
        and(
          eq(runtimeEvents.environment, environment),
          gte(runtimeEvents.lastOccurredAt, since),
          filter.licenseId ? eq(runtimeEvents.licenseId, filter.licenseId) : undefined,
          filter.activationId ? eq(runtimeEvents.activationId, filter.activationId) : undefined,
          filter.productId ? eq(runtimeEvents.productId, filter.productId) : undefined,
          page.after ? gt(runtimeEvents.id, page.after) : undefined,
        ),
      )
      .orderBy(asc(runtimeEvents.id))
      .limit(page.limit + 1)
      .all();
  }

  purgeExpired(): number {
    const cutoff = this.deps.clock.now().getTime() - RETENTION_MS;
    return this.deps.sqlite.run("DELETE FROM runtime_events WHERE last_occurred_at < ?", [cutoff]).changes;
  }
}

export function presentRuntimeEvent(row: RuntimeEventRow) {
  return {
    operation: row.operation,
    outcome: "rejected" as const,
    code: row.code,
    http_status: row.httpStatus,
    occurrences: row.occurrences,
    first_occurred_at: row.firstOccurredAt.toISOString(),
    last_occurred_at: row.lastOccurredAt.toISOString(),
    last_request_id: row.lastRequestId,
    product_id: row.productId,
    license_id: row.licenseId,
    activation_id: row.activationId,
    details_omitted: row.detailsOmitted,
  };
}
