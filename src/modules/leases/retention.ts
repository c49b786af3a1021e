import type { Deps } from "../../deps.ts";
import { idBefore } from "../../domain/ids.ts";
import { nextTurn } from "../../store/stepped-count.ts";
import { leaseExpiriesSettledThrough } from "../webhooks/expiries.ts";
import { MonthCounts } from "./month-counts.ts";

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

/**
 * What one step did: `counted` month starts whose count it finished, `scanned` leases it read to
 * count them, `purged` leases it deleted; `more` says another step has work (call again, after a
 * turn of the loop).
 */
export interface LeaseRetentionStep {
  counted: number;
  scanned: number;
  purged: number;
  more: boolean;
}

/** What a pass did: leases deleted, and the `lease.expired` mark when it held the cutoff back. */
export interface LeaseRetentionPass {
  purged: number;
  heldBackBy: Date | null;
}

/**
 * Deletes finished leases after `LEASE_RETENTION_DAYS`, a batch per step, off the request path
 * (the sweeper runs a pass every 10 minutes). A lease goes once its `expires_at`, and its
 * `released_at` if it has one, are both older than the cutoff: now minus the retention, or the
 * `lease.expired` mark if that is earlier, so a lease whose expiry the scan has not reached yet
 * stays and its announcement is never lost, however long the server was down or the scan is
 * behind. Before it deletes anything, steps count the seats of every month start that has passed
 * (by an hour, `MONTH_COUNT_DELAY_MS`) into `lease_month_counts`, a chunk of the leases table per
 * step (month-counts.ts), so a first pass after an upgrade counts a store's whole history a few
 * milliseconds at a time: no lease a past month's report counts is deleted before that count is
 * stored. A month start that passed less than an hour ago holds back nothing: every lease held at
 * it expired after it, within the retention.
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
  /** The `lease.expired` mark, when it held the last step's cutoff back from now minus the retention. */
  private heldBackBy: number | null = null;
  private readonly retentionMs: number;
  private readonly batch: number;
  private readonly months: MonthCounts;
  private readonly statements;

  constructor(
    private readonly deps: Pick<Deps, "sqlite" | "clock">,
    options: { retentionDays?: number; batch?: number; countChunk?: number } = {},
  ) {
    this.retentionMs = (options.retentionDays ?? LEASE_RETENTION_DAYS) * DAY_MS;
    this.batch = options.batch ?? LEASE_PURGE_BATCH;
    this.months = new MonthCounts(deps.sqlite, options.countChunk);
    const { sqlite } = deps;
    this.statements = {
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

  /** The moment before which a finished lease may go (see the class comment). */
  private cutoff(now: number): number {
    const announced = leaseExpiriesSettledThrough(this.deps.sqlite);
    const retained = now - this.retentionMs;
    this.heldBackBy = announced !== null && announced < retained ? announced : null;
    return Math.min(retained, announced ?? Number.POSITIVE_INFINITY);
  }

  /**
   * One short unit of work: a chunk of the count of a month start that has passed, else deletes
   * what one batch of at most `batch` leases holds that may go.
   */
  step(): LeaseRetentionStep {
    const now = this.deps.clock.now().getTime();
    const counting = this.months.step(now);
    if (counting) return { ...counting, purged: 0, more: true };
    const cutoff = this.cutoff(now);
    const ids = this.statements.window.all(this.cursor, idBefore("lse", cutoff), this.batch);
    const last = ids.at(-1)?.id;
    if (last === undefined) {
      this.cursor = "";
      return { counted: 0, scanned: 0, purged: 0, more: false };
    }
    const purged = this.statements.purge.run(this.cursor, last, cutoff).changes;
    // A short batch reached the cutoff: the pass is done, and the next one starts from the front.
    const more = ids.length === this.batch;
    this.cursor = more ? last : "";
    return { counted: 0, scanned: 0, purged, more };
  }

  /**
   * Steps until nothing is left, with a turn of the event loop before each step so requests are
   * not held up behind a backlog (nor a server's start behind the first step). `stopped` ends the
   * pass between steps (shutdown).
   */
  async pass(options: { stopped?: () => boolean } = {}): Promise<LeaseRetentionPass> {
    let purged = 0;
    this.heldBackBy = null;
    for (;;) {
      await nextTurn();
      if (options.stopped?.()) break;
      let step: ReturnType<LeaseRetention["step"]>;
      try {
        step = this.step();
      } catch (error) {
        throw new LeasePurgeFailed(error, purged);
      }
      purged += step.purged;
      if (!step.more) break;
    }
    return { purged, heldBackBy: this.heldBackBy === null ? null : new Date(this.heldBackBy) };
  }
}

/** A pass that failed part-way: the batches before the failing one were deleted, and say how many. */
export class LeasePurgeFailed extends Error {
  constructor(
    cause: unknown,
    readonly purged: number,
  ) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.name = "LeasePurgeFailed";
  }
}
