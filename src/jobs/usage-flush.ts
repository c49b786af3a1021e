import type { Logger } from "../http/logger.ts";
import { FLUSH_EVERY_MS } from "../modules/plan/usage-meter.ts";

/**
 * Writes the usage meter's counts held in memory every FLUSH_EVERY_MS (docs/api.md: "every 100
 * requests or 5 seconds, and at shutdown"). The meter also writes when a count arrives 5 seconds
 * after its last write, but in a quiet spell no count arrives (GET /mgmt/v1/plan is not counted,
 * so polling it writes nothing): without this, answered calls waited for the sweeper's pass, ten
 * minutes, and a kill -9 in between lost them. Returns the stop function.
 */
export function startUsageFlusher(
  meter: { readonly pendingCount: number; flush(): void },
  logger: Logger,
  intervalMs = FLUSH_EVERY_MS,
): () => void {
  const timer = setInterval(() => flushPendingUsage(meter, logger), intervalMs);
  timer.unref?.();
  return () => clearInterval(timer);
}

/** One tick of the flusher: writes what is pending, if anything; a failure is kept for the next tick. */
export function flushPendingUsage(
  meter: { readonly pendingCount: number; flush(): void },
  logger: Logger,
): void {
  if (meter.pendingCount === 0) return;
  try {
    meter.flush();
  } catch (error) {
    // The counts stay pending (UsageMeter.flush) and are written by a later tick or at shutdown.
    logger.log("error", "usage counts not recorded", { error: (error as Error).message });
  }
}
