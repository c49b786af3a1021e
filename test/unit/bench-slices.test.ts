import { describe, expect, test } from "bun:test";
import { addTally, emptyTally, floorOf } from "../bench/lib/floor.ts";
import { mergeWrk, parseWrk, type WrkResult } from "../bench/lib/wrk.ts";

/** replay.lua's grid (99 points of 1%, then 100 of 0.01%) for a latency given by its quantile function. */
function grid(latencyUsAt: (p: number) => number): number[] {
  return [
    ...Array.from({ length: 99 }, (_, k) => latencyUsAt(k + 0.5)),
    ...Array.from({ length: 100 }, (_, k) => latencyUsAt(99 + (k + 0.5) / 100)),
  ];
}

function slice(overrides: Partial<WrkResult> & { requests: number }): WrkResult {
  return {
    durationSec: 2,
    rps: overrides.requests / 2,
    statuses: { "200": overrides.requests },
    non2xx: 0,
    socketErrors: 0,
    exhausted: 0,
    sent: overrides.requests,
    loadgenCpuSec: 0.5,
    latencyMs: { mean: 1, p50: 1, p90: 1, p99: 1, p999: 1, max: 1 },
    quantilesUs: grid(() => 1000),
    ...overrides,
  };
}

describe("a route run in slices is reported as one run", () => {
  test("counts, durations and statuses add up, and the throughput is the whole run's", () => {
    const merged = mergeWrk([
      slice({ requests: 6000, durationSec: 2, statuses: { "200": 5990, "401": 10 }, non2xx: 10 }),
      slice({ requests: 2000, durationSec: 2.5, statuses: { "200": 2000 }, exhausted: 3 }),
    ]);
    expect(merged.requests).toBe(8000);
    expect(merged.durationSec).toBe(4.5);
    expect(merged.rps).toBeCloseTo(8000 / 4.5, 6);
    expect(merged.statuses).toEqual({ "200": 7990, "401": 10 });
    expect(merged.non2xx).toBe(10);
    expect(merged.exhausted).toBe(3);
    expect(merged.loadgenCpuSec).toBe(1);
  });

  test("one slice's percentiles come back as that slice measured them", () => {
    // Uniform latency from 0 to 100 ms: the p-th percentile is p ms.
    const merged = mergeWrk([slice({ requests: 5000, quantilesUs: grid((p) => p * 1000) })]);
    expect(merged.latencyMs.p50).toBeCloseTo(50, 6);
    expect(merged.latencyMs.p90).toBeCloseTo(90, 6);
    expect(merged.latencyMs.p99).toBeCloseTo(99, 6);
    expect(merged.latencyMs.p999).toBeCloseTo(99.9, 6);
  });

  test("each slice's latencies weigh by its requests, not one vote per slice", () => {
    // Three quarters of the requests took 1 ms, a quarter 3 ms: the median is 1 ms, p90 3 ms.
    const merged = mergeWrk([
      slice({
        requests: 3000,
        quantilesUs: grid(() => 1000),
        latencyMs: { mean: 1, p50: 1, p90: 1, p99: 1, p999: 1, max: 1.2 },
      }),
      slice({
        requests: 1000,
        quantilesUs: grid(() => 3000),
        latencyMs: { mean: 3, p50: 3, p90: 3, p99: 3, p999: 3, max: 7.5 },
      }),
    ]);
    expect(merged.latencyMs.p50).toBe(1);
    expect(merged.latencyMs.p90).toBe(3);
    expect(merged.latencyMs.mean).toBeCloseTo(1.5, 9);
    expect(merged.latencyMs.max).toBe(7.5);
  });

  test("a slow tail in one slice shows in the merged p99.9 but not in the median", () => {
    const steady = grid((p) => 1000 + p * 10);
    const stalled = grid((p) => (p >= 99 ? 40_000 : 1000 + p * 10));
    const merged = mergeWrk([
      slice({ requests: 4000, quantilesUs: steady }),
      slice({ requests: 4000, quantilesUs: steady }),
      slice({ requests: 2000, quantilesUs: stalled }),
    ]);
    // 1% of the third slice is 0.2% of all requests: above p99.9, below p99.
    expect(merged.latencyMs.p999).toBeGreaterThan(30);
    expect(merged.latencyMs.p99).toBeLessThan(2);
    expect(merged.latencyMs.p50).toBeCloseTo(1.5, 1);
  });

  test("nothing to merge is an error, not a run of zero requests", () => {
    expect(() => mergeWrk([])).toThrow("no runs");
  });
});

/** replay.lua's output line for a run whose latency is uniform from 0 to 100 ms. */
function benchJson(quantiles: number[], p50Us = 50_000, p99Us = 99_000): string {
  return `BENCH_JSON ${JSON.stringify({
    requests: 5000,
    duration_us: 2_000_000,
    bytes: 1,
    statuses: { "200": 4990, "401": 10 },
    exhausted: 0,
    loaded: 9000,
    sent: 5032,
    errors: { connect: 0, read: 1, write: 0, status: 10, timeout: 2 },
    latency_us: { mean: 50_000, max: 100_000, p50: p50Us, p90: 90_000, p99: p99Us, p999: 99_900 },
    quantiles,
  })}`;
}

describe("a wrk run as replay.lua reports it", () => {
  test("its counts, rate and errors are read as wrk counted them", () => {
    const run = parseWrk(benchJson(grid((p) => p * 1000)), 0.7);
    expect(run).toMatchObject({
      requests: 5000,
      durationSec: 2,
      rps: 2500,
      non2xx: 10,
      socketErrors: 3,
      sent: 5032,
    });
    expect(run.latencyMs.p99).toBe(99);
    expect(run.loadgenCpuSec).toBe(0.7);
  });

  test("a latency grid of another length than replay.lua's is refused, not merged with wrong weights", () => {
    expect(() => parseWrk(benchJson(grid((p) => p * 1000).slice(1)), 0)).toThrow("198 latency quantiles");
  });

  test("a grid that does not give back wrk's own median is refused (two definitions of one grid)", () => {
    // The grid in milliseconds where wrk counts microseconds.
    expect(() => parseWrk(benchJson(grid((p) => p)), 0)).toThrow("latency grid gives p50");
  });
});

describe("the floor of a route's slices", () => {
  /** A tally in which every operation took 10 µs a call, with `verify` as given. */
  function tally(verify: [number, number], httpCpuSec: number, httpRequests: number) {
    const measured = emptyTally();
    for (const name of Object.keys(measured.ops) as (keyof typeof measured.ops)[])
      measured.ops[name] = [1000, 100];
    measured.ops.verify_us = verify;
    measured.httpCpuSec = httpCpuSec;
    measured.httpRequests = httpRequests;
    return measured;
  }

  test("is the total time over the total calls of every slice, so a longer slice weighs more", () => {
    const first = tally([50_000, 1000], 0.5, 40_000); // verify 50 µs a call
    const second = tally([300_000, 3000], 1, 40_000); // verify 100 µs a call
    const { ops, httpUs } = floorOf(addTally(addTally(emptyTally(), first), second));
    expect(ops.verify_us).toBeCloseTo(350_000 / 4000, 9);
    expect(ops.sign_us).toBeCloseTo(10, 9);
    expect(httpUs).toBeCloseTo((1.5 * 1e6) / 80_000, 9);
  });

  test("an operation or the HTTP floor never measured is an error, not a floor of NaN", () => {
    const noSign = tally([50_000, 1000], 0.5, 40_000);
    noSign.ops.sign_us = [0, 0];
    expect(() => floorOf(noSign)).toThrow("measured no sign");
    expect(() => floorOf(tally([50_000, 1000], 0, 0))).toThrow("measured no HTTP request");
  });

  test("adding a tally leaves the one added unchanged", () => {
    const from = emptyTally();
    from.ops.sign_us = [2000, 100];
    const into = addTally(emptyTally(), from);
    addTally(into, from);
    expect(from.ops.sign_us).toEqual([2000, 100]);
    expect(into.ops.sign_us).toEqual([4000, 200]);
  });
});
