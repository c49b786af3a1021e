import type { Deps } from "../../deps.ts";
import { idBefore } from "../../domain/ids.ts";
import { nextTurn } from "../../store/stepped-count.ts";

/** Finished deliveries (with their attempts) stay readable in the delivery log this long. */
export const DELIVERY_RETENTION_DAYS = 30;
/** Deliveries (and orphaned events) deleted per transaction: a few milliseconds of the thread each. */
const PURGE_CHUNK = 1_000;

/**
 * Deletes one chunk of what the retention lets go: finished deliveries (succeeded, failed,
 * cancelled) that ended more than the retention ago, their attempts, and events no delivery names
 * any more. Queued deliveries are never touched, however old. One short transaction; `more`: the
 * chunk was full, so there may be more to delete.
 */
export function purgeFinishedChunk(
  deps: Pick<Deps, "sqlite" | "clock">,
  retentionDays = DELIVERY_RETENTION_DAYS,
  chunk = PURGE_CHUNK,
): { deliveries: number; more: boolean } {
  const cutoff = deps.clock.now().getTime() - retentionDays * 86_400_000;
  const deliveryBound = idBefore("whd", cutoff);
  const eventBound = idBefore("msg", cutoff);
  return deps.sqlite
    .transaction(() => {
      const old = deps.sqlite
        .query<{ id: string }, [string, number, number]>(
          `SELECT id FROM webhook_deliveries WHERE id < ? AND status IN ('succeeded', 'failed', 'cancelled')
         AND completed_at < ? LIMIT ?`,
        )
        .all(deliveryBound, cutoff, chunk);
      const attempts = deps.sqlite.query<unknown, [string]>(
        "DELETE FROM webhook_attempts WHERE delivery_id = ?",
      );
      const delivery = deps.sqlite.query<unknown, [string]>("DELETE FROM webhook_deliveries WHERE id = ?");
      for (const { id } of old) {
        attempts.run(id);
        delivery.run(id);
      }
      const events = deps.sqlite
        .query<unknown, [string, number]>(
          `DELETE FROM webhook_events WHERE id IN (SELECT e.id FROM webhook_events e WHERE e.id < ?
           AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id) LIMIT ?)`,
        )
        .run(eventBound, chunk).changes;
      return { deliveries: old.length, more: old.length === chunk || events === chunk };
    })
    .immediate();
}

/**
 * One purge pass: chunk after chunk until nothing older than the retention is left, so the
 * clean-up keeps up with any rate of deliveries (a cap per hourly pass did not: 5,000 an hour is
 * 120k a day). Each chunk is its own short transaction and the event loop gets a turn between
 * chunks, so requests are not held up behind a large backlog. `stopped` ends the pass between
 * chunks (shutdown). Returns how many deliveries went.
 */
export async function purgeFinishedDeliveries(
  deps: Pick<Deps, "sqlite" | "clock">,
  options: { retentionDays?: number; chunk?: number; stopped?: () => boolean } = {},
): Promise<number> {
  let removed = 0;
  while (!options.stopped?.()) {
    const { deliveries, more } = purgeFinishedChunk(deps, options.retentionDays, options.chunk);
    removed += deliveries;
    if (!more) break;
    await nextTurn();
  }
  return removed;
}
