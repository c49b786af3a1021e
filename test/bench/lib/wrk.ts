import { join } from "node:path";
import { pinned } from "./server.ts";

export const REPLAY_SCRIPT = join(import.meta.dir, "..", "replay.lua");

export interface WrkResult {
  requests: number;
  durationSec: number;
  rps: number;
  /** Responses by HTTP status. */
  statuses: Record<string, number>;
  non2xx: number;
  /** Socket errors and timeouts. */
  socketErrors: number;
  /** Requests sent after the file ran out (the file was too small for the run). */
  exhausted: number;
  /** Pre-signed requests actually sent. */
  sent: number;
  /** CPU seconds wrk itself used (user + system). */
  loadgenCpuSec: number;
  latencyMs: { mean: number; p50: number; p90: number; p99: number; p999: number; max: number };
  /** replay.lua's latency grid, µs (see QUANTILE_WEIGHTS): what mergeWrk merges percentiles from. */
  quantilesUs: number[];
}

/**
 * The share of requests each of replay.lua's 199 quantiles stands for: 99 of 1% (the middle of
 * each percent up to the 99th), then 100 of 0.01%.
 */
const QUANTILE_WEIGHTS = [...Array<number>(99).fill(0.01), ...Array<number>(100).fill(0.0001)];

/**
 * Several runs as one: counts summed, percentiles from the runs' merged latency distributions
 * (each run's quantiles weighted by its requests), the mean weighted, the max the largest.
 */
export function mergeWrk(runs: WrkResult[]): WrkResult {
  if (runs.length === 0) throw new Error("mergeWrk: no runs");
  if (runs.some((run) => run.quantilesUs.length !== QUANTILE_WEIGHTS.length))
    throw new Error(`mergeWrk: a run without replay.lua's ${QUANTILE_WEIGHTS.length} latency quantiles`);
  const sum = (pick: (run: WrkResult) => number) => runs.reduce((total, run) => total + pick(run), 0);
  const requests = sum((run) => run.requests);
  const durationSec = sum((run) => run.durationSec);
  const statuses: Record<string, number> = {};
  for (const run of runs)
    for (const [code, n] of Object.entries(run.statuses)) statuses[code] = (statuses[code] ?? 0) + n;
  const points = runs
    .flatMap((run) =>
      run.quantilesUs.map((us, i) => ({ us, weight: run.requests * (QUANTILE_WEIGHTS[i] ?? 0) })),
    )
    .sort((a, b) => a.us - b.us);
  const totalWeight = points.reduce((total, point) => total + point.weight, 0);
  if (!(totalWeight > 0)) throw new Error("mergeWrk: no request completed in any run");
  // Each point stands at the middle of the requests it represents; between two, interpolate.
  let seen = 0;
  const positions = points.map((point) => {
    seen += point.weight;
    return (seen - point.weight / 2) / totalWeight;
  });
  const percentileMs = (p: number) => {
    const at = positions.findIndex((position) => position >= p / 100);
    if (at <= 0) return ((at === 0 ? points[0]?.us : points.at(-1)?.us) ?? 0) / 1000;
    const [low, high] = [points[at - 1], points[at]] as [{ us: number }, { us: number }];
    const share = (p / 100 - (positions[at - 1] ?? 0)) / ((positions[at] ?? 1) - (positions[at - 1] ?? 0));
    return (low.us + (high.us - low.us) * share) / 1000;
  };
  return {
    requests,
    durationSec,
    rps: requests / durationSec,
    statuses,
    non2xx: sum((run) => run.non2xx),
    socketErrors: sum((run) => run.socketErrors),
    exhausted: sum((run) => run.exhausted),
    sent: sum((run) => run.sent),
    loadgenCpuSec: sum((run) => run.loadgenCpuSec),
    latencyMs: {
      mean: sum((run) => run.latencyMs.mean * run.requests) / requests,
      p50: percentileMs(50),
      p90: percentileMs(90),
      p99: percentileMs(99),
      p999: percentileMs(99.9),
      max: Math.max(...runs.map((run) => run.latencyMs.max)),
    },
    quantilesUs: [],
  };
}

interface RawWrk {
  requests: number;
  duration_us: number;
  statuses: Record<string, number>;
  exhausted: number;
  sent: number;
  errors: { connect: number; read: number; write: number; status: number; timeout: number };
  latency_us: { mean: number; max: number; p50: number; p90: number; p99: number; p999: number };
  quantiles: number[];
}

/** Replays FILE against URL with wrk (closed loop: `connections` requests in flight) for `durationSec`. */
export async function runWrk(options: {
  url: string;
  file: string;
  durationSec: number;
  connections: number;
  threads?: number;
  cpus: string | null;
  /** Replay the file round and round instead of once (replay.lua's "cycle"). */
  cycle?: boolean;
}): Promise<WrkResult> {
  const threads = options.threads ?? 1;
  const proc = Bun.spawn(
    pinned(options.cpus, [
      "wrk",
      `-t${threads}`,
      `-c${options.connections}`,
      `-d${options.durationSec}s`,
      "--timeout",
      "10s",
      "-s",
      REPLAY_SCRIPT,
      options.url,
      "--",
      options.file,
      String(threads),
      ...(options.cycle ? ["cycle"] : []),
    ]),
    { stdout: "pipe", stderr: "pipe" },
  );
  const [stdout, stderr, exitCode] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ]);
  const line = stdout.split("\n").find((l) => l.startsWith("BENCH_JSON "));
  if (exitCode !== 0 || !line) throw new Error(`wrk failed (exit ${exitCode}):\n${stdout}\n${stderr}`);
  return parseWrk(line, Number(proc.resourceUsage()?.cpuTime.total ?? 0) / 1e6);
}

/**
 * One `BENCH_JSON` line of replay.lua as a WrkResult. The latency grid must be replay.lua's (199
 * points), and interpolated alone it must give back wrk's own median: the grid and
 * QUANTILE_WEIGHTS are written in two languages, and this is where they meet.
 */
export function parseWrk(line: string, loadgenCpuSec: number): WrkResult {
  const raw = JSON.parse(line.slice("BENCH_JSON ".length)) as RawWrk;
  const durationSec = raw.duration_us / 1e6;
  const non2xx = Object.entries(raw.statuses)
    .filter(([code]) => !code.startsWith("2"))
    .reduce((sum, [, n]) => sum + n, 0);
  const ms = (us: number) => us / 1000;
  const result: WrkResult = {
    requests: raw.requests,
    durationSec,
    rps: raw.requests / durationSec,
    statuses: raw.statuses,
    non2xx,
    socketErrors: raw.errors.connect + raw.errors.read + raw.errors.write + raw.errors.timeout,
    exhausted: raw.exhausted,
    sent: raw.sent,
    loadgenCpuSec,
    latencyMs: {
      mean: ms(raw.latency_us.mean),
      p50: ms(raw.latency_us.p50),
      p90: ms(raw.latency_us.p90),
      p99: ms(raw.latency_us.p99),
      p999: ms(raw.latency_us.p999),
      max: ms(raw.latency_us.max),
    },
    quantilesUs: raw.quantiles,
  };
  if (raw.quantiles.length !== QUANTILE_WEIGHTS.length)
    throw new Error(
      `replay.lua printed ${raw.quantiles.length} latency quantiles, not ${QUANTILE_WEIGHTS.length}`,
    );
  // The median only: a slice whose slowest 1% stalled can legitimately jump between p99 and the
  // next point of the grid, and a whole run should not be lost to it.
  if (raw.requests > 1000) {
    const alone = mergeWrk([result]).latencyMs.p50;
    const own = result.latencyMs.p50;
    if (Math.abs(alone - own) > Math.max(0.05, own * 0.1))
      throw new Error(`replay.lua's latency grid gives p50 ${alone} ms where wrk says ${own} ms`);
  }
  return result;
}
