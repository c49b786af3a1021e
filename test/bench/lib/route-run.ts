import { addTally, emptyTally, type FloorMeter, type FloorOps, type FloorTally, floorOf } from "./floor.ts";
import { machineBusySeconds, sample } from "./procstat.ts";
import { fixed, thousands } from "./report.ts";
import { type BenchRequest, writeRequestFile } from "./requests.ts";
import type { RunContext } from "./run-context.ts";
import { mergeWrk, runWrk, type WrkResult } from "./wrk.ts";

/** What a closed-loop run drives: a process to sample and the URL wrk sends to. */
interface Target {
  pid: number;
  url: string;
}

export interface RouteRun {
  name: string;
  wrk: WrkResult;
  cpuPct: number;
  cpuUsPerRequest: number;
  rssBeforeMiB: number;
  rssAfterMiB: number;
  hwmMiB: number;
  /** CPU of other processes on the machine during the run, % of one core (noise). */
  otherPct: number;
  signedRequests: number;
  signSec: number;
  /** The floor measured in the slices between this route's (floor.ts). */
  floor: FloorOps;
  /** The HTTP + JSON floor's CPU µs per request in those slices. */
  httpUs: number;
  floorTally: FloorTally;
}

export interface MeasureOptions {
  estimate: number;
  /** false: trust `estimate` and skip the calibration run (when requests are scarce, as leases to release). */
  calibrate?: boolean;
  durationSec?: number;
  cpus?: string | null;
  connections?: number;
}

/**
 * Seconds of each route slice; each is followed by a floor slice as long: half of it the floor's
 * operations, half the HTTP floor (wrk takes whole seconds).
 */
const ROUTE_SLICE_SEC = 2;

/**
 * One route, closed loop with wrk, judged against the floor of the seconds it ran in: its
 * `durationSec` is run as slices of ROUTE_SLICE_SEC, and after each slice the floor meter measures
 * the floor's operations and the HTTP floor for as long (floor.ts says why).
 *
 * Calibrates first (a short run, which is also the warm-up), then signs enough requests for every
 * slice at the calibrated rate plus a margin, right before the slices, so every timestamp is well
 * inside the 300 s window; runs it all again with bigger files if any slice ran out.
 */
export async function measure(
  ctx: RunContext,
  name: string,
  target: Target,
  floor: FloorMeter,
  build: (n: number) => BenchRequest[] | Promise<BenchRequest[]>,
  options: MeasureOptions,
): Promise<RouteRun> {
  const { config } = ctx;
  const durationSec = options.durationSec ?? config.durationSec;
  const slices = Math.max(1, Math.round(durationSec / ROUTE_SLICE_SEC));
  const cpus = options.cpus === undefined ? ctx.loadCpus : options.cpus;
  const connections = options.connections ?? config.connections;
  let estimate = options.estimate;
  for (let attempt = 0; attempt < 4 && options.calibrate !== false; attempt++) {
    const file = ctx.requestFile();
    writeRequestFile(file, await build(Math.ceil(estimate * config.calibrateSec * 2) + 200));
    const calibration = await runWrk({
      url: target.url,
      file,
      durationSec: config.calibrateSec,
      connections,
      cpus,
    });
    if (calibration.exhausted === 0) {
      estimate = calibration.rps;
      break;
    }
    estimate *= 4;
  }
  // A slice is short: the rate moves more within one than over a whole run, hence the margin.
  let perSlice = Math.ceil(estimate * ROUTE_SLICE_SEC * 2) + 200;
  for (let attempt = 0; attempt < 3; attempt++) {
    const signStart = performance.now();
    const requests = await build(perSlice * slices);
    const files = Array.from({ length: slices }, (_, k) => {
      const file = ctx.requestFile();
      writeRequestFile(file, requests.slice(k * perSlice, (k + 1) * perSlice));
      return file;
    });
    const signSec = (performance.now() - signStart) / 1000;
    const runs: WrkResult[] = [];
    const floorTally = emptyTally();
    let sliceCpu = 0;
    let wallSec = 0;
    let other = 0;
    const first = sample(target.pid);
    let last = first;
    for (const file of files) {
      const before = sample(target.pid);
      const busyBefore = machineBusySeconds();
      const selfBefore = process.cpuUsage();
      const result = await runWrk({ url: target.url, file, durationSec: ROUTE_SLICE_SEC, connections, cpus });
      const after = sample(target.pid);
      const self = process.cpuUsage(selfBefore);
      const busy = machineBusySeconds() - busyBefore;
      runs.push(result);
      sliceCpu += after.cpuSec - before.cpuSec;
      wallSec += (after.at - before.at) / 1000;
      other += busy - (after.cpuSec - before.cpuSec) - result.loadgenCpuSec - (self.user + self.system) / 1e6;
      if (result.exhausted > 0) break;
      addTally(floorTally, await floor.slice((ROUTE_SLICE_SEC * 1000) / 2, ROUTE_SLICE_SEC / 2));
      last = sample(target.pid);
    }
    const merged = mergeWrk(runs);
    if (merged.exhausted > 0) {
      ctx.log(`  ${name}: a slice's ${perSlice} requests ran out; signing more`);
      perSlice = Math.ceil(perSlice * 1.8);
      continue;
    }
    const measuredFloor = floorOf(floorTally);
    return {
      name,
      wrk: merged,
      cpuPct: (sliceCpu / wallSec) * 100,
      // Everything the server used from the first slice to the end of the last floor slice: what
      // a request left for later (the WAL checkpointer, a sweep) is charged to the route too.
      cpuUsPerRequest: ((last.cpuSec - first.cpuSec) / Math.max(1, merged.requests)) * 1e6,
      rssBeforeMiB: first.rssMiB,
      rssAfterMiB: last.rssMiB,
      hwmMiB: last.hwmMiB,
      otherPct: Math.max(0, (other / wallSec) * 100),
      signedRequests: requests.length,
      signSec,
      floor: measuredFloor.ops,
      httpUs: measuredFloor.httpUs,
      floorTally,
    };
  }
  throw new Error(`${name}: the request files kept running out`);
}

export function describeRun(run: RouteRun): string {
  const w = run.wrk;
  const statuses = Object.entries(w.statuses)
    .map(([code, n]) => `${code}:${n}`)
    .join(" ");
  return `${run.name}: ${thousands(w.rps)} req/s, p50 ${fixed(w.latencyMs.p50, 2)} ms, p99 ${fixed(w.latencyMs.p99, 2)} ms, p99.9 ${fixed(w.latencyMs.p999, 2)} ms, non-2xx ${w.non2xx}, socket errors ${w.socketErrors}, server CPU ${fixed(run.cpuPct)}% (${fixed(run.cpuUsPerRequest)} µs/req), RSS ${fixed(run.rssBeforeMiB)}→${fixed(run.rssAfterMiB)} MiB, other CPU ${fixed(run.otherPct)}% [${statuses}]`;
}
