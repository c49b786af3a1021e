import { and, count, eq, gt, isNull, lte, or } from "drizzle-orm";
import type { Deps } from "../../deps.ts";
import { monthLabel, monthStart, nextMonthStart } from "../../domain/months.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import { licenses } from "../../store/schema/index.ts";
import { leasesHeldAt } from "../leases/month-counts.ts";

export interface ReportPeriod {
  label: string;
  start: Date;
  end: Date;
}

const MONTH = /^(\d{4})-(0[1-9]|1[0-2])$/;

/**
 * `period` is `current_month` (default), `previous_month`, or a calendar month `YYYY-MM` (UTC).
 * Anything else, or a month that has not started, is 400.
 */
export function resolvePeriod(period: string | undefined, now: Date): ReportPeriod {
  const month = (start: Date): ReportPeriod => ({
    label: monthLabel(start),
    start,
    end: nextMonthStart(start),
  });
  if (period === undefined || period === "current_month") return month(monthStart(now));
  if (period === "previous_month") return month(monthStart(now, -1));
  const match = MONTH.exec(period);
  if (!match) {
    throw new ApiError("INVALID_REQUEST", "period must be current_month, previous_month or YYYY-MM.", {
      period,
    });
  }
  if (Number(match[1]) < 1970) throw new ApiError("INVALID_REQUEST", "period is before 1970.", { period });
  const start = new Date(Date.UTC(Number(match[1]), Number(match[2]) - 1, 1));
  if (start.getTime() > now.getTime())
    throw new ApiError("INVALID_REQUEST", "period has not started yet.", { period });
  return month(start);
}

export class UsageReportService {
  constructor(private readonly deps: Pick<Deps, "db" | "sqlite" | "clock">) {}

  report(environment: Environment, period: string | undefined) {
    const now = this.deps.clock.now();
    const resolved = resolvePeriod(period, now);
    const at = resolved.end.getTime() < now.getTime() ? resolved.end : now;
    const count = (sql: string, ...params: (string | number)[]) =>
      this.deps.sqlite.query<{ n: number }, (string | number)[]>(sql).get(...params)?.n ?? 0;
    return {
      period: { label: resolved.label, start: resolved.start.toISOString(), end: resolved.end.toISOString() },
      new_activations: count(
        "SELECT count(*) AS n FROM activations WHERE environment = ? AND activated_at >= ? AND activated_at < ?",
        environment,
        resolved.start.getTime(),
        resolved.end.getTime(),
      ),
      // Devices that held an activation at the end of the period (or now).
      active_machines: count(
        `SELECT count(*) AS n FROM activations WHERE environment = ? AND activated_at <= ?
         AND (deactivated_at IS NULL OR deactivated_at > ?)`,
        environment,
        at.getTime(),
        at.getTime(),
      ),
      active_licenses: this.activeLicensesAt(environment, at),
      // Seats held at that moment. A past month's is read from the count stored before its
      // leases could be deleted (leases/retention.ts), so the purge never changes it.
      active_leases: leasesHeldAt(this.deps.sqlite, environment, at),
    };
  }

  /** Licenses that existed at `at` and were neither revoked, suspended nor expired then. */
  private activeLicensesAt(environment: Environment, at: Date): number {
    return (
      this.deps.db
        .select({ n: count() })
        .from(licenses)
        .where(
          and(
            eq(licenses.environment, environment),
            lte(licenses.createdAt, at),
            or(isNull(licenses.revokedAt), gt(licenses.revokedAt, at)),
            or(isNull(licenses.suspendedAt), gt(licenses.suspendedAt, at)),
            or(isNull(licenses.expiresAt), gt(licenses.expiresAt, at)),
          ),
        )
        .get()?.n ?? 0
    );
  }
}
