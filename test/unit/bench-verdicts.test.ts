import { describe, expect, test } from "bun:test";
import type { CrashResult } from "../bench/lib/crash.ts";
import { emptyTally, type FloorOps } from "../bench/lib/floor.ts";
import type { OpenLoopResult } from "../bench/lib/open-model.ts";
import type { RouteRun } from "../bench/lib/route-run.ts";
import { type AcceptanceRow, acceptanceRows, type ScaleResult } from "../bench/lib/run-report.ts";

/**
 * A heartbeat floor of 200 µs (http 20 + verify 80 + read 10 + write 30 + 2 × sign 30) and an
 * activation floor of 300 µs (its writes 130 in place of the one write).
 */
const OPS: FloorOps = {
  verify_us: 80,
  sign_us: 30,
  read_us: 10,
  write_us: 30,
  append_us: 40,
  page50_us: 90,
  heartbeat_write_us: 70,
  activation_write_us: 130,
};

function run(name: string, rps: number, overrides: Partial<RouteRun> = {}): RouteRun {
  return {
    name,
    wrk: {
      requests: rps * 12,
      durationSec: 12,
      rps,
      statuses: { "200": rps * 12 },
      non2xx: 0,
      socketErrors: 0,
      exhausted: 0,
      sent: rps * 12,
      loadgenCpuSec: 3,
      latencyMs: { mean: 9, p50: 8, p90: 12, p99: 20, p999: 30, max: 40 },
      quantilesUs: [],
    },
    cpuPct: 99,
    cpuUsPerRequest: 1e6 / rps,
    rssBeforeMiB: 100,
    rssAfterMiB: 110,
    hwmMiB: 120,
    otherPct: 0,
    signedRequests: rps * 20,
    signSec: 1,
    floor: OPS,
    httpUs: 20,
    floorTally: emptyTally(),
    ...overrides,
  };
}

const open = (p99: number, failed = 0) =>
  ({ rate: 1500, failed, latency_ms: { p50: 1, p90: 3, p99, p999: 20, max: 30 } }) as OpenLoopResult;

const crash = (lost: string[] = [], activations = 2000) =>
  ({
    lostActivations: lost,
    lostLeases: [],
    checked: { activations, leases: 1500 },
  }) as unknown as CrashResult;

const scale = (beforeRps: number, afterRps: number) =>
  ({
    rowsBefore: 10_000,
    rowsAfter: 1_010_000,
    heartbeatBefore: run("heartbeat, 10,000 activations (beside the 1M run)", beforeRps),
    heartbeat: run("heartbeat, 1,010,000 activations", afterRps),
  }) as ScaleResult;

/** The row whose target starts with `target`. */
function row(rows: AcceptanceRow[], target: string): AcceptanceRow {
  const found = rows.find((r) => r[0].startsWith(target));
  if (!found) throw new Error(`no row for ${target}`);
  return found;
}

const results = (overrides: Partial<Parameters<typeof acceptanceRows>[0]> = {}) => ({
  heartbeat: run("heartbeat", 3000),
  activation: run("activation", 1700),
  open: open(8),
  crash: crash(),
  scale: scale(3000, 2500),
  ...overrides,
});

describe("the bench's verdicts", () => {
  test("the heartbeat is judged against the floor of its own slices: 3,000/s is 60% of 200 µs, not of 190", () => {
    expect(row(acceptanceRows(results()), "heartbeat throughput")).toEqual([
      "heartbeat throughput ≥ 60% of floor",
      "3,000 / 5,000 req/s",
      "60%",
      "60%",
      "PASS",
    ]);
    const fasterFloor = run("heartbeat", 3000, { floor: { ...OPS, verify_us: 70 } });
    expect(row(acceptanceRows(results({ heartbeat: fasterFloor })), "heartbeat throughput")[4]).toBe("FAIL");
  });

  test("the activation's floor counts its writes, not one UPDATE: 1,700/s is 51% of 300 µs", () => {
    const verdict = row(acceptanceRows(results()), "activation throughput");
    expect(verdict.slice(1)).toEqual(["1,700 / 3,333 req/s", "51%", "51%", "PASS"]);
  });

  test("a judged route with an error answer fails whatever its ratio", () => {
    const heartbeat = run("heartbeat", 4000);
    heartbeat.wrk.non2xx = 1;
    const activation = run("activation", 3000);
    activation.wrk.socketErrors = 2;
    const rows = acceptanceRows(results({ heartbeat, activation }));
    expect(row(rows, "heartbeat throughput").slice(2)).toEqual(["80%", "80%", "FAIL"]);
    expect(row(rows, "activation throughput")[4]).toBe("FAIL");
  });

  test("1M/10k compares the two alternating runs, not the 1M run with the heartbeat route measured earlier", () => {
    // The heartbeat route ran at 4,000/s, but the 10k server beside the 1M one at 3,000/s.
    const rows = acceptanceRows(results({ heartbeat: run("heartbeat", 4000), scale: scale(3000, 2500) }));
    const verdict = row(rows, "heartbeat 1M / 10k");
    expect(verdict[2]).toBe("83%");
    expect(verdict[4]).toBe("PASS");
    // Both scale runs are set against the heartbeat's floor formula (a NaN would mean no floor).
    expect(verdict[1]).toBe("2,500 / 3,000 req/s (of floor 50% / 60%)");
    expect(row(acceptanceRows(results({ scale: scale(3000, 2300) })), "heartbeat 1M / 10k")[4]).toBe("FAIL");
    expect(row(acceptanceRows(results({ scale: undefined })), "heartbeat 1M / 10k")[4]).toBe("SKIPPED");
  });

  test("the open model passes under 10 ms with every request answered, and fails otherwise", () => {
    expect(row(acceptanceRows(results({ open: open(9.99) })), "heartbeat p99")[4]).toBe("PASS");
    expect(row(acceptanceRows(results({ open: open(10) })), "heartbeat p99")[4]).toBe("FAIL");
    expect(row(acceptanceRows(results({ open: open(5, 1) })), "heartbeat p99")[4]).toBe("FAIL");
  });

  test("kill -9 passes only when something was acknowledged and nothing of it was lost", () => {
    expect(row(acceptanceRows(results()), "no acknowledged write lost")[4]).toBe("PASS");
    expect(row(acceptanceRows(results({ crash: crash(["act_1"]) })), "no acknowledged write lost")[4]).toBe(
      "FAIL",
    );
    expect(row(acceptanceRows(results({ crash: crash([], 0) })), "no acknowledged write lost")[4]).toBe(
      "FAIL",
    );
  });
});
