import type { Database } from "bun:sqlite";
import type { Deps } from "../../deps.ts";
import { idBefore } from "../../domain/ids.ts";
import type { Environment } from "../../domain/scopes.ts";
import { leaseExpiriesSettledThrough } from "../webhooks/expiries.ts";

/**
 * How long a finished lease stays after its expiry and its release, whichever is later. Nothing
 * the service answers needs it longer: the usage report's past months are counted into
 * `lease_month_counts` before their leases may go, the current month counts only live leases, and
 * the `lease.expired` scan is never overtaken (below). What the week keeps is the exact answer to
 * a device that renews or releases a lease it took before going quiet (410 `LEASE_RELEASED`,
 * 422 `LEASE_EXPIRED` / `INVALID_TRANSITION`; later, 404, which means the same: take a new one),
 * and a lease idempotency replay (24 hours). The table then holds a week of leases, not every
 * lease ever taken: the `lease.expired` scan reads all of it every 30 s while an endpoint
 * subscribes, and the lease routes' indexes grow with it (docs/operations.md "Retention").
 */
export const LEASE_RETENTION_DAYS = 7;
/**
 * Leases read (and at most deleted) per statement. A deleted lease removes entries from three
 * indexes and its count row, so 1,000 of them is a few milliseconds of the thread that serves
 * heartbeats; the pass yields to the event loop between statements.
 */
export const LEASE_PURGE_BATCH = 200;

const DAY_MS = 86_400_000;

/** What one step did: `more` says another step has work (call again, after a turn of the loop). */
export interface LeaseRetentionStep {
  counted: number;
  purged: number;
  more: boolean;
}

const monthStart = (ms: number): number => {
  const d = new Date(ms);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
};
const nextMonth = (ms: number): number => {
  const d = new Date(ms);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
};

/**
 * Seats held at `at` in an environment: leases taken by then, not released by then and not yet
 * expired. Naming both statuses lets SQLite seek each license's leases by expiry in its
 * (license_id, status, expires_at) index and skip long-expired ones (docs/performance.md).
 */
function countHeldAt(sqlite: Database, environment: Environment, at: number): number {
  return (
    sqlite
      .query<{ n: number }, [Environment, number]>(
        `SELECT count(*) AS n FROM leases l JOIN licenses c ON c.id = l.license_id WHERE c.environment = ?1
         AND l.status IN ('active', 'released') AND l.expires_at > ?2
         AND l.created_at <= ?2 AND (l.released_at IS NULL OR l.released_at > ?2)`,
      )
      .get(environment, at)?.n ?? 0
  );
}

/**
 * The usage report's `active_leases` at `at`: the stored count when `at` is a month start already
 * counted, else the leases table. A month start not counted yet still has every lease it counts:
 * the purge deletes nothing while a month start that has passed is not counted.
 */
export function leasesHeldAt(sqlite: Database, environment: Environment, at: Date): number {
  const stored = sqlite
    .query<{ active: number }, [Environment, number]>(
      "SELECT active FROM lease_month_counts WHERE environment = ? AND at = ?",
    )
    .get(environment, at.getTime());
  return stored?.active ?? countHeldAt(sqlite, environment, at.getTime());
}

/**
 * Deletes finished leases after `LEASE_RETENTION_DAYS`, a batch per step, off the request path
 * (the sweeper runs a pass every 10 minutes). A lease goes once its `expires_at`, and its
 * `released_at` if it has one, are both older than the cutoff: now minus the retention, or the
 * `lease.expired` mark if that is earlier, so a lease whose expiry the scan has not reached yet
 * stays and its announcement is never lost, however long the server was down or the scan is
 * behind. Before it deletes anything, a step counts the seats of every month start that has passed
 * into `lease_month_counts` (one month start per step, so a first pass after an upgrade counts a
 * store's whole history a month at a time): no lease a past month's report counts is deleted
 * before that count is stored.
 *
 * The walk goes along the id index (ids are time-ordered, so leases made before the cutoff are a
 * prefix of it): each batch is a seek to where the last one ended plus `batch` entries, never a
 * scan. No index on `expires_at`: every renewal moves it, and one more index moving with each
 * renewal cost it 22-45% (docs/performance.md). Leases still live at the front (an app that has
 * held its seat for months) are stepped over, not re-read by every batch.
 */
export class LeaseRetention {
  /** Where the pass under way stopped: the last lease id its batches read ("" = from the start). */
  private cursor = "";
  private readonly retentionMs: number;
  private readonly batch: number;
  private readonly statements;

  constructor(
    private readonly deps: Pick<Deps, "sqlite" | "clock">,
    options: { retentionDays?: number; batch?: number } = {},
  ) {
    this.retentionMs = (options.retentionDays ?? LEASE_RETENTION_DAYS) * DAY_MS;
    this.batch = options.batch ?? LEASE_PURGE_BATCH;
    const { sqlite } = deps;
    this.statements = {
      lastCounted: sqlite.prepare<{ at: number | null }, []>("SELECT max(at) AS at FROM lease_month_counts"),
      // The oldest lease by id (the primary key's index): its creation, to a millisecond.
      oldest: sqlite.prepare<{ created_at: number }, []>("SELECT created_at FROM leases ORDER BY id LIMIT 1"),
      store: sqlite.prepare<unknown, [number, number, number]>(
        "INSERT INTO lease_month_counts (environment, at, active) VALUES ('live', ?1, ?2), ('test', ?1, ?3) ON CONFLICT DO NOTHING",
      ),
      // Index only (the primary key's): the next `batch` ids made before the cutoff.
      window: sqlite.prepare<{ id: string }, [string, string, number]>(
        "SELECT id FROM leases WHERE id > ? AND id < ? ORDER BY id LIMIT ?",
      ),
      purge: sqlite.prepare<unknown, [string, string, number]>(
        `DELETE FROM leases WHERE id > ?1 AND id <= ?2
         AND expires_at < ?3 AND (released_at IS NULL OR released_at < ?3)`,
      ),
    };
  }

  /**
   * The first month start whose seats are not counted yet: the one after the last counted, or,
   * before any, the start of the month the oldest lease was taken in. Null: no lease was ever
   * kept, so there is nothing to count or delete.
   */
  private firstUncounted(): number | null {
    const last = this.statements.lastCounted.get()?.at ?? null;
    if (last !== null) return nextMonth(last);
    const oldest = this.statements.oldest.get();
    return oldest ? monthStart(oldest.created_at) : null;
  }

  /** The moment before which a finished lease may go (see the class comment). */
  private cutoff(now: number): number {
    const announced = leaseExpiriesSettledThrough(this.deps.sqlite);
    return Math.min(now - this.retentionMs, announced ?? Number.POSITIVE_INFINITY);
  }

  /**
   * One short unit of work: counts the seats of one month start that has passed, else deletes
   * what one batch of at most `batch` leases holds that may go.
   */
  step(): LeaseRetentionStep {
    const { sqlite } = this.deps;
    const now = this.deps.clock.now().getTime();
    const uncounted = this.firstUncounted();
    // Strictly past: a lease taken later in this very millisecond would count at this moment.
    if (uncounted !== null && uncounted < now) {
      this.statements.store.run(
        uncounted,
        countHeldAt(sqlite, "live", uncounted),
        countHeldAt(sqlite, "test", uncounted),
      );
      return { counted: 1, purged: 0, more: true };
    }
    const cutoff = this.cutoff(now);
    const ids = this.statements.window.all(this.cursor, idBefore("lse", cutoff), this.batch);
    const last = ids.at(-1)?.id;
    if (last === undefined) {
      this.cursor = "";
      return { counted: 0, purged: 0, more: false };
    }
    const purged = this.statements.purge.run(this.cursor, last, cutoff).changes;
    // A short batch reached the cutoff: the pass is done, and the next one starts from the front.
    const more = ids.length === this.batch;
    this.cursor = more ? last : "";
    return { counted: 0, purged, more };
  }

  /**
   * Steps until nothing is left, with a turn of the event loop between steps so requests are not
   * held up behind a backlog. `stopped` ends the pass between steps (shutdown). Returns how many
   * leases went.
   */
  async pass(options: { stopped?: () => boolean } = {}): Promise<number> {
    let purged = 0;
    while (!options.stopped?.()) {
      const step = this.step();
      purged += step.purged;
      if (!step.more) break;
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    return purged;
  }
}
