import type { Deps } from "../../deps.ts";
import { CROCKFORD_ALPHABET } from "../../domain/base32.ts";

/** Finished deliveries (with their attempts) stay readable in the delivery log this long. */
export const DELIVERY_RETENTION_DAYS = 30;
const BATCH = 5_000;

/** The smallest id of this prefix made at `ms`: ids are time-ordered, so `id <` it means "made before". */
function idBefore(prefix: string, ms: number): string {
  let time = "";
  let rest = ms;
  for (let i = 0; i < 10; i++) {
    time = CROCKFORD_ALPHABET[rest % 32] + time;
    rest = Math.floor(rest / 32);
  }
  return `${prefix}_${time}${"0".repeat(16)}`;
}

/**
 * Deletes finished deliveries (succeeded, failed, cancelled) that ended more than the retention
 * ago, their attempts, and events no delivery names any more. Queued deliveries are never
 * touched, however old. Bounded per call; returns how many deliveries went.
 */
export function purgeFinishedDeliveries(
  deps: Pick<Deps, "sqlite" | "clock">,
  retentionDays = DELIVERY_RETENTION_DAYS,
): number {
  const cutoff = deps.clock.now().getTime() - retentionDays * 86_400_000;
  const deliveryBound = idBefore("whd", cutoff);
  const eventBound = idBefore("msg", cutoff);
  return deps.sqlite.transaction(() => {
    const old = deps.sqlite
      .query<{ id: string }, [string, number, number]>(
        `SELECT id FROM webhook_deliveries WHERE id < ? AND status IN ('succeeded', 'failed', 'cancelled')
         AND completed_at < ? LIMIT ?`,
      )
      .all(deliveryBound, cutoff, BATCH);
    const attempts = deps.sqlite.query<unknown, [string]>(
      "DELETE FROM webhook_attempts WHERE delivery_id = ?",
    );
    const delivery = deps.sqlite.query<unknown, [string]>("DELETE FROM webhook_deliveries WHERE id = ?");
    for (const { id } of old) {
      attempts.run(id);
      delivery.run(id);
    }
    deps.sqlite
      .query<unknown, [string, number]>(
        `DELETE FROM webhook_events WHERE id IN (SELECT e.id FROM webhook_events e WHERE e.id < ?
           AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id) LIMIT ?)`,
      )
      .run(eventBound, BATCH);
    return old.length;
  })();
}
