import { describe, expect, test } from "bun:test";
import { AdjustableClock, type Clock } from "../../src/domain/clock.ts";

/** A base clock the test moves by hand, standing in for real time passing. */
const movingBase = (startMs: number) => {
  let ms = startMs;
  const base: Clock = { now: () => new Date(ms) };
  return { base, pass: (deltaMs: number) => (ms += deltaMs) };
};

describe("the adjustable clock", () => {
  test("follows its base clock plus every advance", () => {
    const real = movingBase(1_000_000);
    const clock = new AdjustableClock(real.base);
    clock.advance(60);
    real.pass(1500);
    expect(clock.now().getTime()).toBe(1_000_000 + 60_000 + 1500);
  });

  test("a frozen clock ignores real time passing but still moves on advance", () => {
    const real = movingBase(2_000_000);
    const clock = new AdjustableClock(real.base);
    clock.advance(10);
    const frozen = clock.freeze().getTime();
    expect(frozen).toBe(2_010_000);
    real.pass(5000);
    expect(clock.now().getTime()).toBe(frozen);
    clock.advance(30);
    expect(clock.now().getTime()).toBe(frozen + 30_000);
  });

  test("a resumed clock runs on from where it stood, without jumping to real time", () => {
    const real = movingBase(3_000_000);
    const clock = new AdjustableClock(real.base);
    const frozen = clock.freeze().getTime();
    real.pass(7000);
    expect(clock.resume().getTime()).toBe(frozen);
    real.pass(250);
    expect(clock.now().getTime()).toBe(frozen + 250);
    expect(clock.resume().getTime()).toBe(frozen + 250);
  });
});
