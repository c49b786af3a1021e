/**
 * How long a verification start (email or trial) takes to answer at the least, whichever way it
 * went. Both outcomes already do the same reads, HMACs, encryption and writes, but a start that
 * sends a code still finds a user, follows its assignment and has its foreign keys checked: tens
 * of microseconds in a server whose store has grown and whose page cache is shared (the bench's
 * verification timing told the outcomes apart in two of three full runs this way, never in a fresh
 * store). Answering at a fixed time after the handler began hides what is left, and whatever the
 * next change adds, as long as the work stays under the floor (about 1 ms here). See
 * docs/performance.md, "Verification timing".
 */
export const VERIFICATION_START_FLOOR_MS = 5;

/**
 * A promise that settles `VERIFICATION_START_FLOOR_MS` after it is made: make it before the work,
 * await it after. The timer must be armed before the work, not with the time the work left over:
 * Bun's timers round their delay down to whole milliseconds, so a sleep of "floor minus elapsed"
 * would end earlier or later with the work's own sub-millisecond duration, and carry the very
 * difference it is meant to hide.
 */
export function verificationStartFloor(): Promise<void> {
  return Bun.sleep(VERIFICATION_START_FLOOR_MS);
}
