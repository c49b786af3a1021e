import type { Database, Statement } from "bun:sqlite";

/** How many calls share one commit at most; the rest go into the next one, a turn later. */
const DEFAULT_MAX_BATCH = 64;
/**
 * How long a batch keeps taking calls: every call of a batch is answered only after the last one
 * has run, so a batch of 64 heartbeats after a hiccup would make all of them wait ~20 ms. Past
 * this much work the batch commits and the rest go into the next one. At ~0.25 ms a call, 5 ms
 * still shares a commit among some 20 calls (the commit's savings are nearly all had by then);
 * 2 ms cost throughput where calls are slow (a store far larger than its page cache).
 */
const DEFAULT_BATCH_BUDGET_MS = 5;

interface Pending {
  work: () => unknown;
  resolve: (value: unknown) => void;
  reject: (error: unknown) => void;
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };

/**
 * Device calls that arrive in the same turn of the event loop share one SQLite commit. A commit
 * costs a fixed ~30 µs on top of its pages (WAL and shared-memory locks, a write per page), which
 * on a heartbeat is more than its reads; a batch pays it once, and writes the pages several calls
 * touch (the nonce table's last leaf, the count rows) once.
 *
 * Nothing is acknowledged early: each call's promise settles only after the commit that holds its
 * writes, so an answer the client has seen is on disk in the WAL (kill -9 safe), exactly as with a
 * commit per call. A call that throws has its writes rolled back and its error delivered, and the
 * others commit (see runBatch for how). If the commit itself fails, every call of the batch fails
 * with that error and nothing of it is kept.
 *
 * The calls run synchronously one after another inside the drain, so nothing else on this
 * connection (a management request, a sweeper) can slip writes into the batch. `hold` stops
 * draining for a moment (the WAL restart, checkpointer.ts) without blocking the event loop: calls
 * queue and run when `release` is called.
 */
export class GroupCommit {
  private queue: Pending[] = [];
  private scheduled = false;
  private holds = 0;
  private readonly statements: Record<
    "begin" | "commit" | "rollback" | "savepoint" | "release" | "undo",
    Statement
  >;

  constructor(
    private readonly sqlite: Database,
    private readonly maxBatch = DEFAULT_MAX_BATCH,
    private readonly budgetMs = DEFAULT_BATCH_BUDGET_MS,
    /** Milliseconds the budget is measured in; tests pass a clock they move by hand. */
    private readonly now: () => number = () => performance.now(),
  ) {
    this.statements = {
      begin: sqlite.prepare("BEGIN IMMEDIATE"),
      commit: sqlite.prepare("COMMIT"),
      rollback: sqlite.prepare("ROLLBACK"),
      savepoint: sqlite.prepare("SAVEPOINT group_commit_call"),
      release: sqlite.prepare("RELEASE group_commit_call"),
      undo: sqlite.prepare("ROLLBACK TO group_commit_call"),
    };
  }

  /** Runs `work` in the next shared transaction; settles once that transaction has committed. */
  run<T>(work: () => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.queue.push({ work, resolve: resolve as (value: unknown) => void, reject });
      this.schedule();
    });
  }

  /** Calls waiting for their commit (for the WAL restart and tests). */
  get waiting(): number {
    return this.queue.length;
  }

  /** Stops draining until `release`; queued and new calls wait. Holds nest. */
  hold(): void {
    this.holds++;
  }

  release(): void {
    if (this.holds === 0) return;
    this.holds--;
    if (this.holds === 0) this.schedule();
  }

  private schedule(): void {
    if (this.scheduled || this.holds > 0 || this.queue.length === 0) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      if (this.holds > 0) return;
      const batch = this.queue.splice(0, this.maxBatch);
      const ran = this.drain(batch);
      // Calls the budget left out go first into the next batch, in their order.
      if (ran < batch.length) this.queue.unshift(...batch.slice(ran));
      this.schedule();
    });
  }

  /** Runs a prefix of `batch` (as much as the budget allows) and settles it; returns its length. */
  private drain(batch: Pending[]): number {
    const progress = { ran: 0 };
    let outcomes: Outcome[];
    try {
      outcomes = this.runBatch(batch, progress);
    } catch (error) {
      // A transaction that could not even begin fails every call; otherwise those it held.
      const failed = progress.ran === 0 ? batch : batch.slice(0, progress.ran);
      for (const call of failed) call.reject(error);
      return failed.length;
    }
    outcomes.forEach((outcome, i) => {
      const call = batch[i] as Pending;
      if (outcome.ok) call.resolve(outcome.value);
      else call.reject(outcome.error);
    });
    return outcomes.length;
  }

  /**
   * The whole batch in one transaction; throws (having rolled back) if it cannot commit. Calls
   * almost never throw (the gate turns refusals into values), so the batch first runs without a
   * savepoint per call: each level of savepoint copies every page it touches. If a call does throw,
   * that attempt is rolled back as a whole and the batch runs again with each call in its own
   * savepoint, which is safe because nothing of the first attempt was kept. The second run takes
   * the calls the first one reached, the failing one last, and no more.
   *
   * Returns the outcomes of the calls it ran (a prefix of `batch`); `progress.ran` says how many
   * took part in the transaction, for a commit that fails.
   */
  private runBatch(batch: Pending[], progress: { ran: number }): Outcome[] {
    // Someone else's transaction left open on this connection would swallow the batch's commit.
    if (this.sqlite.inTransaction)
      throw new Error("group commit: the connection is already in a transaction");
    return (
      this.attempt(batch, false, progress) ??
      (this.attempt(batch.slice(0, progress.ran), true, progress) as Outcome[])
    );
  }

  /**
   * One try at the batch, taking calls while the budget lasts (at least one); null when a call
   * threw in a try without savepoints (rolled back, with `progress.ran` counting it).
   */
  private attempt(batch: Pending[], isolated: boolean, progress: { ran: number }): Outcome[] | null {
    const { begin, commit, rollback, savepoint, release, undo } = this.statements;
    begin.run();
    const outcomes: Outcome[] = [];
    const started = this.now();
    let committing = false;
    try {
      for (const call of batch) {
        if (!isolated) {
          if (outcomes.length > 0 && this.now() - started >= this.budgetMs) break;
          progress.ran = outcomes.length + 1;
          outcomes.push({ ok: true, value: call.work() });
          continue;
        }
        savepoint.run();
        try {
          outcomes.push({ ok: true, value: call.work() });
          release.run();
        } catch (error) {
          undo.run();
          release.run();
          outcomes.push({ ok: false, error });
        }
      }
      committing = true;
      commit.run();
    } catch (error) {
      if (this.sqlite.inTransaction) rollback.run();
      if (!isolated && !committing) return null;
      throw error;
    }
    return outcomes;
  }
}
