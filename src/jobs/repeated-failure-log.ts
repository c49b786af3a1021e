import type { Logger } from "../http/logger.ts";

/** A failure that repeats is logged at most this often, as the WAL worker's is (checkpointer.ts). */
export const REPEATED_FAILURE_LOG_MS = 60_000;

export interface RepeatedFailureLogOptions {
  /** The message of a failure's line, logged at error level. */
  failed: string;
  /** The message of the line that says the step works again, logged at info level. */
  recovered: string;
  /** Monotonic milliseconds (performance.now by default); tests give a clock of their own. */
  nowMs?: () => number;
  intervalMs?: number;
}

/**
 * The log of a background step that fails on every pass while its cause lasts: a full disk failed
 * each wake-up of the webhook dispatcher, hundreds of error lines in seconds under load. The first
 * failure is logged at once; after it, at most one line an interval, with `suppressed`, how many
 * failures were not logged since the line before; and the first success after a logged failure is
 * logged with that count too. So at most two lines an interval, however often the step runs and
 * however it flaps between failing and working.
 */
export class RepeatedFailureLog {
  private lastFailureLoggedAt = Number.NEGATIVE_INFINITY;
  private suppressed = 0;
  /** The last line said it failed: the next success is logged. */
  private failing = false;
  private readonly nowMs: () => number;
  private readonly intervalMs: number;

  constructor(
    private readonly logger: Logger,
    private readonly options: RepeatedFailureLogOptions,
  ) {
    this.nowMs = options.nowMs ?? (() => performance.now());
    this.intervalMs = options.intervalMs ?? REPEATED_FAILURE_LOG_MS;
  }

  failed(error: unknown): void {
    const now = this.nowMs();
    if (now - this.lastFailureLoggedAt < this.intervalMs) {
      this.suppressed++;
      return;
    }
    this.lastFailureLoggedAt = now;
    this.failing = true;
    this.logger.log("error", this.options.failed, {
      error: error instanceof Error ? error.message : String(error),
      suppressed: this.takeSuppressed(),
    });
  }

  succeeded(): void {
    if (!this.failing) return;
    this.failing = false;
    this.logger.log("info", this.options.recovered, { suppressed: this.takeSuppressed() });
  }

  private takeSuppressed(): number {
    const count = this.suppressed;
    this.suppressed = 0;
    return count;
  }
}
