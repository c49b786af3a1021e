import type { Database } from "bun:sqlite";
import { monthStart, nextMonthStart } from "../../domain/months.ts";
import type { Environment } from "../../domain/scopes.ts";
import { countInSteps } from "../../store/stepped-count.ts";

/**
 * Leases read per counting step. A chunk is a seek in the id index plus this many entries and
 * their rows: 5,000 took 1.7-2.1 ms (p99 2.9) at a million leases (docs/performance.md), as a
 * lease purge batch does, on the thread that serves heartbeats.
 */
export const LEASE_COUNT_CHUNK = 5_000;
/**
 * A month start is counted once it is this far in the past, not at once: a clock running ahead
 * (a host whose time is put right later) would otherwise freeze a count taken before the month
 * start really passed. Stored counts of month starts the clock has not passed by as much are
 * dropped and counted again (a clock stepped back). Far shorter than the lease retention, so the
 * leases held at a month start not counted yet are still there (none of them is finished a week).
 */
export const MONTH_COUNT_DELAY_MS = 3_600_000;

/** Index only: how many lease ids in (after, through] the next chunk holds, and where it ends. */
const ID_CHUNK_SQL = `SELECT count(*) AS n, max(id) AS last FROM
  (SELECT id FROM leases WHERE id > ?1 AND id <= ?2 ORDER BY id LIMIT ?3)`;
interface IdChunk {
  n: number;
  last: string | null;
}

/**
 * The seats held at ?3 among the leases with ids in (?1, ?2] taken before ?4, per environment. A
 * lease is held at a moment when it was not released by then and not yet expired. A month start's
 * count takes ?4 = ?3: a lease taken at that very millisecond is the new month's (as the usage
 * report's other figures count it), while one released or expiring then is no longer held. Each
 * lease reads its license by primary key, for the environment.
 */
const HELD_IN_CHUNK_SQL = `SELECT c.environment AS environment, count(*) AS n
  FROM leases l JOIN licenses c ON c.id = l.license_id
  WHERE l.id > ?1 AND l.id <= ?2
    AND l.status IN ('active', 'released') AND l.expires_at > ?3
    AND l.created_at < ?4 AND (l.released_at IS NULL OR l.released_at > ?3)
  GROUP BY c.environment`;
interface HeldInChunk {
  environment: Environment;
  n: number;
}

/**
 * The usage report's `active_leases` at `at`: the stored count when `at` is a month start already
 * counted, else the leases table, a chunk of `chunk` leases in id order at a time (`countInSteps`).
 * One statement over the table walked every license of the environment and sought its leases: 0.8 s
 * at a million licenses, however few leases, with every heartbeat waiting (docs/performance.md).
 * Chunk by chunk is exact for the same reasons as `MonthCounts` below: whether a lease was held at a
 * passed moment never changes, and one taken after the walk began was taken after `at`.
 *
 * A month start not counted yet still has every lease it counts: the purge deletes nothing while a
 * month start more than `MONTH_COUNT_DELAY_MS` past is not counted, and every lease held at a later
 * one expired after it, well within the retention.
 */
export function leasesHeldAt(
  sqlite: Database,
  environment: Environment,
  at: Date,
  /** Leases taken at or after this (ms) are not counted: `at` for a month start, just after it for now. */
  takenBefore: number,
  chunk = LEASE_COUNT_CHUNK,
): Promise<number> {
  const stored = sqlite
    .query<{ active: number }, [Environment, number]>(
      "SELECT active FROM lease_month_counts WHERE environment = ? AND at = ?",
    )
    .get(environment, at.getTime());
  if (stored) return Promise.resolve(stored.active);
  const ids = sqlite.query<IdChunk, [string, string, number]>(ID_CHUNK_SQL);
  const held = sqlite.query<HeldInChunk, [string, string, number, number]>(HELD_IN_CHUNK_SQL);
  const through = sqlite.query<{ id: string | null }, []>("SELECT max(id) AS id FROM leases").get()?.id ?? "";
  let after = "";
  return countInSteps(() => {
    if (after >= through) return null;
    const window = ids.get(after, through, chunk);
    const last = window?.last ?? through;
    const counted =
      held.all(after, last, at.getTime(), takenBefore).find((row) => row.environment === environment)?.n ?? 0;
    after = last;
    return counted;
  });
}

interface Progress {
  at: number;
  after_id: string;
  through_id: string;
  live: number;
  test: number;
}

/** What one counting step did: `counted` month starts finished and stored, `scanned` leases read. */
export interface MonthCountStep {
  counted: number;
  scanned: number;
}

/**
 * Counts the seats held at each month start (UTC) per environment into `lease_month_counts`, one
 * chunk of the leases table per step, in id order (the primary key's index), so no step holds the
 * thread for more than a few milliseconds however large the table or long its history. The month
 * start being counted, the last id read and the counts so far are stored with each chunk
 * (`lease_month_count_progress`), so a restart resumes the count. The walk ends at the last id
 * there was when the count began.
 *
 * Chunk by chunk is exact, not an estimate: whether a lease was held at a past moment never
 * changes afterwards (a renewal or a release sets a later time, and a lease expired by then cannot
 * be renewed), a lease taken after the count began was taken after the month start (the count
 * begins an hour after it: only a clock put back further could take one earlier), and nothing is
 * deleted while a month start that has passed is not counted (the retention's purge waits for
 * `step` to answer null).
 */
export class MonthCounts {
  private readonly statements;

  constructor(
    private readonly sqlite: Database,
    private readonly chunk = LEASE_COUNT_CHUNK,
  ) {
    this.statements = {
      lastCounted: sqlite.prepare<{ at: number | null }, []>("SELECT max(at) AS at FROM lease_month_counts"),
      // The oldest lease by id (the primary key's index): its creation, to a millisecond.
      oldest: sqlite.prepare<{ created_at: number }, []>("SELECT created_at FROM leases ORDER BY id LIMIT 1"),
      newestId: sqlite.prepare<{ id: string | null }, []>("SELECT max(id) AS id FROM leases"),
      progress: sqlite.prepare<Progress, []>(
        "SELECT at, after_id, through_id, live, test FROM lease_month_count_progress",
      ),
      // Counts of month starts the clock has not passed by MONTH_COUNT_DELAY_MS: a clock stepped
      // back. They are counted again once the month start has really passed.
      dropEarly: sqlite.prepare<unknown, [number]>("DELETE FROM lease_month_counts WHERE at > ?"),
      dropEarlyProgress: sqlite.prepare<unknown, [number]>(
        "DELETE FROM lease_month_count_progress WHERE at > ?",
      ),
      chunk: sqlite.prepare<IdChunk, [string, string, number]>(ID_CHUNK_SQL),
      held: sqlite.prepare<HeldInChunk, [string, string, number, number]>(HELD_IN_CHUNK_SQL),
      save: sqlite.prepare<unknown, [number, string, string, number, number]>(
        `INSERT INTO lease_month_count_progress (at, after_id, through_id, live, test) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT (at) DO UPDATE SET after_id = excluded.after_id, live = excluded.live, test = excluded.test`,
      ),
      store: sqlite.prepare<unknown, [number, number, number]>(
        "INSERT INTO lease_month_counts (environment, at, active) VALUES ('live', ?1, ?2), ('test', ?1, ?3) ON CONFLICT DO NOTHING",
      ),
      done: sqlite.prepare<unknown, [number]>("DELETE FROM lease_month_count_progress WHERE at = ?"),
    };
  }

  /**
   * The first month start whose seats are not counted yet: the one after the last counted, or,
   * before any, the start of the month the oldest lease was taken in. Null: no lease was ever
   * kept, so there is nothing to count.
   */
  private firstUncounted(): number | null {
    const last = this.statements.lastCounted.get()?.at ?? null;
    if (last !== null) return nextMonthStart(new Date(last)).getTime();
    const oldest = this.statements.oldest.get();
    return oldest ? monthStart(new Date(oldest.created_at)).getTime() : null;
  }

  /**
   * One chunk of the count of the first month start that passed `MONTH_COUNT_DELAY_MS` before
   * `now` and is not counted yet; null when there is none (every such month start is counted).
   */
  step(now: number): MonthCountStep | null {
    const ready = now - MONTH_COUNT_DELAY_MS;
    return this.sqlite
      .transaction((): MonthCountStep | null => {
        // Reads first: a step with nothing to count writes nothing.
        if ((this.statements.lastCounted.get()?.at ?? ready) > ready) this.statements.dropEarly.run(ready);
        let progress = this.statements.progress.get();
        if (progress && progress.at > ready) {
          this.statements.dropEarlyProgress.run(ready);
          progress = null;
        }
        if (!progress) {
          const at = this.firstUncounted();
          if (at === null || at > ready) return null;
          const through = this.statements.newestId.get()?.id ?? "";
          progress = { at, after_id: "", through_id: through, live: 0, test: 0 };
        }
        const { at, after_id: after, through_id: through } = progress;
        const window = this.statements.chunk.get(after, through, this.chunk);
        const scanned = window?.n ?? 0;
        const last = window?.last ?? through;
        let { live, test } = progress;
        if (scanned > 0) {
          for (const row of this.statements.held.all(after, last, at, at)) {
            if (row.environment === "live") live += row.n;
            else test += row.n;
          }
        }
        if (scanned === this.chunk && last < through) {
          this.statements.save.run(at, last, through, live, test);
          return { counted: 0, scanned };
        }
        this.statements.store.run(at, live, test);
        this.statements.done.run(at);
        return { counted: 1, scanned };
      })
      .immediate();
  }
}
