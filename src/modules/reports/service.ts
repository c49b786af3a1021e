import type { Deps } from "../../deps.ts";
import { monthLabel, monthStart, nextMonthStart } from "../../domain/months.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import { countInSteps, timeWindows } from "../../store/stepped-count.ts";
import { LEASE_COUNT_CHUNK, leasesHeldAt } from "../leases/month-counts.ts";

export interface ReportPeriod {
  label: string;
  start: Date;
  end: Date;
}

const MONTH = /^(\d{4})-(0[1-9]|1[0-2])$/;
/** The longest `period` the route's schema documents; longer ones are not looked at. */
export const MAX_PERIOD_LENGTH = 32;

const BAD_PERIOD = "period must be current_month, previous_month or YYYY-MM.";

/**
 * The report's query, checked before its schema is: the spec lists only 400 for this route, so an
 * unknown parameter (`period[]` included) or an overlong period is 400 INVALID_REQUEST, as a bad
 * period's value is, not the 422 a schema failure answers elsewhere.
 */
export function checkReportQuery(query: Record<string, unknown>): void {
  for (const [name, value] of Object.entries(query)) {
    if (name !== "period") {
      throw new ApiError("INVALID_REQUEST", "The usage report takes no query parameter but period.", {
        errors: { [name]: ["is not a known query parameter"] },
      });
    }
    if (typeof value !== "string" || value.length > MAX_PERIOD_LENGTH) {
      throw new ApiError("INVALID_REQUEST", BAD_PERIOD, {
        errors: { period: [`must be at most ${MAX_PERIOD_LENGTH} characters`] },
      });
    }
  }
}

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
    throw new ApiError("INVALID_REQUEST", BAD_PERIOD, { period });
  }
  if (Number(match[1]) < 1970) throw new ApiError("INVALID_REQUEST", "period is before 1970.", { period });
  const start = new Date(Date.UTC(Number(match[1]), Number(match[2]) - 1, 1));
  if (start.getTime() > now.getTime())
    throw new ApiError("INVALID_REQUEST", "period has not started yet.", { period });
  return month(start);
}

/**
 * Index entries per chunk of a count: a chunk is an edge found by stepping over this many entries
 * of a covering index and a count of the same entries, ~2-3 ms at about 80 ns an entry (at a
 * million licenses or activations the counts were 60-80 ms each as one statement).
 */
export const REPORT_CHUNK_ENTRIES = 16_384;

/**
 * The usage report. Each count is taken a chunk at a time with the event loop turning between
 * chunks (`countInSteps`), so a report over millions of rows delays nothing else by more than a
 * chunk. Every count is of a moment or a period that has passed by the time it is read (`at` is
 * at most now), so the chunks agree although rows change between them.
 */
export class UsageReportService {
  private readonly statements;

  constructor(
    private readonly deps: Pick<Deps, "sqlite" | "clock">,
    private readonly chunks = { entries: REPORT_CHUNK_ENTRIES, leases: LEASE_COUNT_CHUNK },
  ) {
    const { sqlite } = deps;
    type Window = [Environment, number, number];
    this.statements = {
      // The time of the entry ?4 entries on in the environment's [?2, ?3), in index order.
      licenseEdge: sqlite.prepare<Edge, [...Window, number]>(
        `SELECT created_at AS t FROM licenses WHERE environment = ?1 AND created_at >= ?2 AND created_at < ?3
         ORDER BY created_at LIMIT 1 OFFSET ?4`,
      ),
      // Licenses made in [?2, ?3) that were neither revoked, suspended nor expired at ?4.
      licensesActive: sqlite.prepare<Counted, [...Window, number]>(
        `SELECT count(*) AS n FROM licenses WHERE environment = ?1 AND created_at >= ?2 AND created_at < ?3
         AND (revoked_at IS NULL OR revoked_at > ?4) AND (suspended_at IS NULL OR suspended_at > ?4)
         AND (expires_at IS NULL OR expires_at > ?4)`,
      ),
      // Licenses made in [?2, ?3), not revoked by ?4, and neither suspended nor expired at ?4 as they
      // were then: from the state before their first change after ?4 where one was kept
      // (license_state_history), else from the row. Revocation is final, so the row tells it.
      licensesActiveThen: sqlite.prepare<Counted, [...Window, number]>(
        `SELECT count(*) AS n FROM licenses l
         LEFT JOIN license_state_history h ON h.license_id = l.id AND h.changed_at =
           (SELECT min(p.changed_at) FROM license_state_history p WHERE p.license_id = l.id AND p.changed_at > ?4)
         WHERE l.environment = ?1 AND l.created_at >= ?2 AND l.created_at < ?3
         AND (l.revoked_at IS NULL OR l.revoked_at > ?4)
         AND (CASE WHEN h.license_id IS NULL THEN l.suspended_at ELSE h.suspended_at END IS NULL
           OR CASE WHEN h.license_id IS NULL THEN l.suspended_at ELSE h.suspended_at END > ?4)
         AND (CASE WHEN h.license_id IS NULL THEN l.expires_at ELSE h.expires_at END IS NULL
           OR CASE WHEN h.license_id IS NULL THEN l.expires_at ELSE h.expires_at END > ?4)`,
      ),
      changedSince: sqlite.prepare<{ one: number }, [number]>(
        "SELECT 1 AS one FROM license_state_history WHERE changed_at > ?1 LIMIT 1",
      ),
      activationEdge: sqlite.prepare<Edge, [...Window, number]>(
        `SELECT activated_at AS t FROM activations WHERE environment = ?1 AND activated_at >= ?2 AND activated_at < ?3
         ORDER BY activated_at LIMIT 1 OFFSET ?4`,
      ),
      activationsMade: sqlite.prepare<Counted, Window>(
        "SELECT count(*) AS n FROM activations WHERE environment = ?1 AND activated_at >= ?2 AND activated_at < ?3",
      ),
      // Activations made in [?2, ?3) that were not deactivated by ?4.
      activationsHeld: sqlite.prepare<Counted, [...Window, number]>(
        `SELECT count(*) AS n FROM activations WHERE environment = ?1 AND activated_at >= ?2 AND activated_at < ?3
         AND (deactivated_at IS NULL OR deactivated_at > ?4)`,
      ),
      // Of those, the ones whose license (made in [?2, ?3)) was revoked by ?4, made before ?5:
      // found from the licenses' index (revoked_at is in it), so only a revoked license's row and
      // its activations are read. Revocation is final, so the row tells it.
      activationsHeldOfRevoked: sqlite.prepare<Counted, [...Window, number, number]>(
        `SELECT count(*) AS n FROM licenses l CROSS JOIN activations a ON a.license_id = l.id
         WHERE l.environment = ?1 AND l.created_at >= ?2 AND l.created_at < ?3 AND l.revoked_at <= ?4
         AND a.activated_at < ?5 AND (a.deactivated_at IS NULL OR a.deactivated_at > ?4)`,
      ),
    };
  }

  async report(environment: Environment, period: string | undefined) {
    const now = this.deps.clock.now();
    const resolved = resolvePeriod(period, now);
    // At `end` itself the month is over: what is made in that millisecond is the next month's.
    const ended = resolved.end.getTime() <= now.getTime();
    // The moment counted: the period's end once it has passed, else now. A change at exactly that
    // moment counts as made (a license revoked at the next month's first millisecond is not active
    // in the month before: migration 0043), but a thing made then is not in the period: it is the
    // next month's, as new_activations counts it. So what is counted was made before `madeBefore`.
    const at = ended ? resolved.end.getTime() : now.getTime();
    const madeBefore = ended ? at : at + 1;
    const { statements: s, chunks } = this;
    const activationEdge = (from: number, end: number, skip: number) =>
      s.activationEdge.get(environment, from, end, skip)?.t ?? null;
    const licenseEdge = (from: number, end: number, skip: number) =>
      s.licenseEdge.get(environment, from, end, skip)?.t ?? null;
    const made = (from: number, to: number) => s.activationsMade.get(environment, from, to)?.n ?? 0;
    const held = (from: number, to: number) => s.activationsHeld.get(environment, from, to, at)?.n ?? 0;
    const heldOfRevoked = (from: number, to: number) =>
      s.activationsHeldOfRevoked.get(environment, from, to, at, madeBefore)?.n ?? 0;
    // Only a license changed after `at` needs its history (never so for the current month).
    const counted = s.changedSince.get(at) ? s.licensesActiveThen : s.licensesActive;
    const active = (from: number, to: number) => counted.get(environment, from, to, at)?.n ?? 0;
    const { start, end } = resolved;
    // One count after another, not all at once: each is already spread over the event loop.
    const newActivations = await countInSteps(
      timeWindows(activationEdge, made, start.getTime(), end.getTime(), chunks.entries),
    );
    // Devices that held an activation at the end of the period (or now), but not those of a
    // license revoked by then: they can no longer use it (heartbeats answer LICENSE_REVOKED),
    // and a vendor planning capacity or billing by machines does not count them.
    const heldActivations = await countInSteps(
      timeWindows(activationEdge, held, EARLIEST, madeBefore, chunks.entries),
    );
    const revokedActivations = await countInSteps(
      timeWindows(licenseEdge, heldOfRevoked, EARLIEST, madeBefore, chunks.entries),
    );
    const activeMachines = heldActivations - revokedActivations;
    const activeLicenses = await countInSteps(
      timeWindows(licenseEdge, active, EARLIEST, madeBefore, chunks.entries),
    );
    // Seats held at that moment. A past month's is read from the count stored before its leases
    // could be deleted (leases/retention.ts), so the purge never changes it.
    const activeLeases = await leasesHeldAt(
      this.deps.sqlite,
      environment,
      new Date(at),
      madeBefore,
      chunks.leases,
    );
    return {
      period: { label: resolved.label, start: resolved.start.toISOString(), end: resolved.end.toISOString() },
      new_activations: newActivations,
      active_machines: activeMachines,
      active_licenses: activeLicenses,
      active_leases: activeLeases,
    };
  }
}

interface Edge {
  t: number;
}
interface Counted {
  n: number;
}

/** Before any stored time (they are milliseconds since 1970, and none is negative). */
const EARLIEST = Number.MIN_SAFE_INTEGER;
