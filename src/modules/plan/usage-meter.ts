import type { Database } from "bun:sqlite";
import type { Clock } from "../../domain/clock.ts";
import { monthLabel, monthStart, nextMonthStart } from "../../domain/months.ts";

/** Writes are batched: at most this many counts, or this long, are held in memory. */
const FLUSH_EVERY_COUNTS = 100;
export const FLUSH_EVERY_MS = 5_000;

/** The month last asked for, and its bounds: every request asks, nearly always for this month. */
let lastMonth = { from: 0, to: 0, label: "" };

export function monthOf(date: Date): string {
  const at = date.getTime();
  if (at >= lastMonth.from && at < lastMonth.to) return lastMonth.label;
  lastMonth = {
    from: monthStart(date).getTime(),
    to: nextMonthStart(date).getTime(),
    label: monthLabel(date),
  };
  return lastMonth.label;
}

/**
 * Monthly request counters for plan quotas. Counting every request with its own write would cost
 * a write per call, so counts gather in memory and are flushed in batches: every 100, when a count
 * arrives 5 seconds after the last write, every 5 seconds in between (jobs/usage-flush.ts) and at
 * shutdown. A crash can forget the last few seconds' counts, which only ever errs in the
 * customer's favour.
 */
export class UsageMeter {
  private readonly persisted = new Map<string, number>();
  private readonly pending = new Map<string, number>();
  private pendingTotal = 0;
  private lastFlush: number;
  /** The last write failed: counts leave retrying to the timer until one succeeds. */
  private writeFailing = false;
  private readonly read;
  private readonly add;

  constructor(
    private readonly sqlite: Database,
    private readonly clock: Clock,
  ) {
    // The first batch is 5 seconds' like any other, not a write of the first count alone.
    this.lastFlush = clock.now().getTime();
    this.read = sqlite.prepare<{ count: number }, [string, string]>(
      "SELECT count FROM usage_counters WHERE metric = ? AND period = ?",
    );
    this.add = sqlite.prepare<unknown, [string, string, number]>(
      `INSERT INTO usage_counters (metric, period, count) VALUES (?, ?, ?)
       ON CONFLICT (metric, period) DO UPDATE SET count = count + excluded.count`,
    );
  }

  /** How many were counted this month, including what is still in memory. */
  used(metric: string, at: Date = this.clock.now()): number {
    const key = `${metric}|${monthOf(at)}`;
    let stored = this.persisted.get(key);
    if (stored === undefined) {
      stored = this.read.get(metric, monthOf(at))?.count ?? 0;
      this.persisted.set(key, stored);
    }
    return stored + (this.pending.get(key) ?? 0);
  }

  count(metric: string, at: Date = this.clock.now()): void {
    this.used(metric, at);
    const key = `${metric}|${monthOf(at)}`;
    this.pending.set(key, (this.pending.get(key) ?? 0) + 1);
    this.pendingTotal++;
    const due = this.pendingTotal >= FLUSH_EVERY_COUNTS || at.getTime() - this.lastFlush >= FLUSH_EVERY_MS;
    // After a failed write only the timer tries again: each try may wait out the busy timeout on
    // the request thread, and every count past a hundred would otherwise try.
    if (!due || this.writeFailing) return;
    try {
      this.flush(at);
    } catch {
      // The call being counted was answered: a failed write of the counts must not turn it into
      // an error. They stay pending (flush changes nothing in memory when it fails), and the
      // timer's next flush writes them or logs why it cannot (jobs/usage-flush.ts).
      this.writeFailing = true;
    }
  }

  /** Counts held in memory, not written yet. */
  get pendingCount(): number {
    return this.pendingTotal;
  }

  /**
   * Writes the pending counts in one transaction. If it fails (the write lock held past the busy
   * timeout, a full disk, a failing COMMIT), nothing in memory changes: the counts stay pending
   * and the next flush writes them, so a month's figure is never counted twice.
   */
  flush(at: Date = this.clock.now()): void {
    this.lastFlush = at.getTime();
    if (this.pendingTotal === 0) return;
    this.sqlite
      .transaction(() => {
        for (const [key, n] of this.pending) {
          const [metric, period] = key.split("|") as [string, string];
          this.add.run(metric, period, n);
        }
      })
      .immediate();
    this.writeFailing = false;
    // Only once committed: `persisted` is what the store holds.
    for (const [key, n] of this.pending) this.persisted.set(key, (this.persisted.get(key) ?? 0) + n);
    this.pending.clear();
    this.pendingTotal = 0;
  }
}
