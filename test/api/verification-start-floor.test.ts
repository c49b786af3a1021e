import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { kernelWakesPrecisely, VERIFICATION_START_FLOOR_MS } from "../../src/http/answer-floor.ts";
import { TestDevice } from "../support/device.ts";
import { type CallResult, createTestContext, type TestContext } from "../support/harness.ts";
import { type NamedUserFixture, namedUserFixture, startVerification } from "../support/named-users.ts";
import { freshEmail, mailsTo, startTrial, type TrialFixture, trialFixture } from "../support/trials.ts";

/**
 * Both verification starts answer at a fixed time after their handler began, whichever way they
 * went (src/http/answer-floor.ts): the floor is a lower bound, so these tests assert only that no
 * answer, sending or silent, comes sooner. Whether the two can be told apart is measured by
 * test/bench/verification-timing.ts, never by a timed test.
 */
let t: TestContext;
let named: NamedUserFixture;
let trial: TrialFixture;
const device = new TestDevice();
// The floor's presence is asserted, not its precision: a millisecond is left for the rounding of
// the two clocks (Bun's timer deadline and performance.now here).
const atLeast = VERIFICATION_START_FLOOR_MS - 1;

beforeAll(async () => {
  t = createTestContext();
  named = await namedUserFixture(t);
  trial = await trialFixture(t);
  // One start of each first, so no measured start carries the first call's compiling and caching
  // (which alone can take longer than the floor, and would let a missing floor pass unseen).
  await startVerification(t, device, named, freshEmail("warm-up"));
  await startTrial(t, trial.productId, freshEmail("warm-up"), device);
});
afterAll(() => t.close());

async function timed(call: () => Promise<CallResult>): Promise<{ result: CallResult; ms: number }> {
  const started = performance.now();
  const result = await call();
  return { result, ms: performance.now() - started };
}

describe("email verification start", () => {
  test("a start that sends a code answers no sooner than the floor", async () => {
    const { result, ms } = await timed(() => startVerification(t, device, named, named.email));
    expect(result.status).toBe(202);
    expect(mailsTo(t, named.email)).toBe(1);
    expect(ms).toBeGreaterThanOrEqual(atLeast);
  });

  test("a silent start for an address with no user answers no sooner than the floor either", async () => {
    const email = freshEmail("nobody");
    const { result, ms } = await timed(() => startVerification(t, device, named, email));
    expect(result.status).toBe(202);
    expect(mailsTo(t, email)).toBe(0);
    expect(ms).toBeGreaterThanOrEqual(atLeast);
  });
});

describe("trial verification start", () => {
  test("a start that sends a code and one held back by the 120 s gap both answer no sooner than the floor", async () => {
    const email = freshEmail("trial");
    const sending = await timed(() => startTrial(t, trial.productId, email, device));
    const held = await timed(() => startTrial(t, trial.productId, email, device));
    expect([sending.result.status, held.result.status]).toEqual([202, 202]);
    expect(mailsTo(t, email)).toBe(1);
    expect(sending.ms).toBeGreaterThanOrEqual(atLeast);
    expect(held.ms).toBeGreaterThanOrEqual(atLeast);
  });
});

describe("the kernel the floor needs", () => {
  test("Linux from 5.11 wakes precisely, older Linux does not, and other systems are not judged", () => {
    expect(kernelWakesPrecisely("linux", "6.18.44-fc-v657")).toBe(true);
    expect(kernelWakesPrecisely("linux", "5.11.0-16-generic")).toBe(true);
    expect(kernelWakesPrecisely("linux", "5.10.0-28-amd64")).toBe(false);
    expect(kernelWakesPrecisely("linux", "4.18.0-513.el8.x86_64")).toBe(false);
    expect(kernelWakesPrecisely("linux", "garbage")).toBeNull();
    expect(kernelWakesPrecisely("darwin", "23.1.0")).toBeNull();
  });
});
