/** Resolves after the event loop has turned once: what a long job awaits between its steps. */
export const nextTurn = (): Promise<void> => new Promise<void>((resolve) => setImmediate(resolve));

/**
 * A count taken one chunk at a time, with a turn of the event loop between chunks. One statement
 * that counts a million rows holds the only JavaScript thread for 60-800 ms, and every heartbeat
 * waits behind it; a chunk of a few thousand rows holds it for a few milliseconds.
 *
 * `step` counts the next chunk, or answers null when none is left. The chunks are separate
 * statements, so rows may change between them: callers count a moment that has passed (`at`),
 * which a later write does not move.
 */
export async function countInSteps(step: () => number | null): Promise<number> {
  let total = 0;
  for (let counted = step(); counted !== null; counted = step()) {
    total += counted;
    await nextTurn();
  }
  return total;
}

/**
 * A purge one batch per statement, with a turn of the event loop between batches, as a count is
 * taken in chunks (countInSteps): one DELETE of a hundred thousand rows held the thread that
 * serves heartbeats for over a second. `step` deletes the next batch and answers how many rows
 * went, or null when none is left; answers the total.
 */
export const purgeInSteps = (step: () => number | null): Promise<number> => countInSteps(step);

/**
 * The steps of a count over an index ordered by a time in milliseconds, from `start` to before
 * `end`. `edge(from, end, skip)` is the time of the index entry `skip` entries on from the first at
 * or after `from` (null when fewer are left), and `count(from, to)` counts the rows of [from, to).
 * A chunk ends at an edge, so each holds about `chunk` entries; when more than a chunk share one
 * millisecond (licenses made in one batch), that millisecond is one chunk, as it cannot be split.
 */
export function timeWindows(
  edge: (from: number, end: number, skip: number) => number | null,
  count: (from: number, to: number) => number,
  start: number,
  end: number,
  chunk: number,
): () => number | null {
  let from = start;
  return () => {
    if (from >= end) return null;
    const found = edge(from, end, chunk);
    const to = found === null ? end : Math.max(found, from + 1);
    const counted = count(from, to);
    from = to;
    return counted;
  };
}
