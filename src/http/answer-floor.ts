/**
 * How long a verification start (email or trial) takes to answer at the least, whichever way it
 * went. Both outcomes already do the same reads, HMACs, encryption and writes, but a start that
 * sends a code still finds a user, follows its assignment and has its foreign keys checked: 8-12
 * µs in process, 27-51 µs inside the server at the end of a full bench run (whose verification
 * timing told the outcomes apart in two of three runs that way, never with the route run alone).
 * Answering at a fixed time after the handler began hides what is left, and whatever the next
 * change adds, as long as the work stays under the floor (well under 1 ms here). See
 * docs/performance.md, "Verification timing".
 */
export const VERIFICATION_START_FLOOR_MS = 5;

/**
 * Runs `work` and resolves with its result no sooner than `VERIFICATION_START_FLOOR_MS` after it
 * began; a `work` that throws rejects at once (a refusal before the shared work tells nothing).
 *
 * The timer is armed before the work, not with the time the work left over: Bun's timers round a
 * delay down to whole milliseconds, so a sleep of "floor minus elapsed" would end earlier or later
 * with the work's own sub-millisecond duration and carry the very difference it is meant to hide.
 * Armed first, its deadline does not depend on the work, and the event loop wakes for it to the
 * microsecond where the kernel has `epoll_pwait2` (Linux 5.11 and later, which Bun uses when it
 * can). On older kernels the loop's wait is counted in whole milliseconds from the moment it goes
 * idle, after the work, and the answer leaves up to a millisecond late by an amount that again
 * follows the work's duration: the floor then hides less, and the equal work in the services is
 * what remains (docs/performance.md).
 */
export async function answerAfterFloor<T>(work: () => T): Promise<T> {
  const floor = Bun.sleep(VERIFICATION_START_FLOOR_MS);
  const result = work();
  await floor;
  return result;
}

/**
 * Whether this kernel lets the event loop wake for the floor's deadline to the microsecond: Linux
 * from 5.11 (`epoll_pwait2`); null where that is not the question (not Linux). Said at start-up,
 * so an operator on an older kernel learns that the floor hides less there.
 */
export function kernelWakesPrecisely(platform: string, release: string): boolean | null {
  if (platform !== "linux") return null;
  const [major, minor] = release.split(/[.-]/).map((part) => Number.parseInt(part, 10));
  if (major === undefined || minor === undefined || Number.isNaN(major) || Number.isNaN(minor)) return null;
  return major > 5 || (major === 5 && minor >= 11);
}
