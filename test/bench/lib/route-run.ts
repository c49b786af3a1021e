import { readdirSync, readFileSync } from "node:fs";
import { addTally, emptyTally, type FloorMeter, type FloorOps, type FloorTally, floorOf } from "./floor.ts";
import { machineBusySeconds, type ProcSample, sample } from "./procstat.ts";
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

/** One route of an interleaved measurement. */
export interface SlicedRoute {
  name: string;
  target: Target;
  build: (n: number) => BenchRequest[] | Promise<BenchRequest[]>;
  options: MeasureOptions;
}

/**
 * One route, closed loop with wrk, judged against the floor of the seconds it ran in: its
 * `durationSec` is run as slices of ROUTE_SLICE_SEC, and after each slice the floor meter measures
 * the floor's operations and the HTTP floor for as long (floor.ts says why).
 */
export async function measure(
  ctx: RunContext,
  name: string,
  target: Target,
  floor: FloorMeter,
  build: (n: number) => BenchRequest[] | Promise<BenchRequest[]>,
  options: MeasureOptions,
): Promise<RouteRun> {
  const [run] = await measureInterleaved(ctx, floor, [{ name, target, build, options }]);
  if (!run) throw new Error(`${name}: no run`);
  return run;
}

/**
 * Several routes whose slices alternate (A, floor, B, floor, A, ...), so that they are compared
 * over the same stretch of the machine's speed: the scale target sets the heartbeat over a million
 * activations against the one over 10k this way. Each route calibrates first (a short run, which is
 * also its warm-up); then every route's requests for every slice are signed, at the calibrated
 * rate with a margin, right before the slices, so every timestamp is well inside the 300 s window;
 * if any slice ran out, it is all run again with bigger files.
 */
export async function measureInterleaved(
  ctx: RunContext,
  floor: FloorMeter,
  routes: SlicedRoute[],
): Promise<RouteRun[]> {
  const { config } = ctx;
  const durationSec = routes[0]?.options.durationSec ?? config.durationSec;
  const slices = Math.max(1, Math.round(durationSec / ROUTE_SLICE_SEC));
  const settings = routes.map((route) => ({
    cpus: route.options.cpus === undefined ? ctx.loadCpus : route.options.cpus,
    connections: route.options.connections ?? config.connections,
  }));
  // A slice is short: the rate moves more within one than over a whole run, hence the margin.
  const perSlice: number[] = [];
  for (const [i, route] of routes.entries()) {
    const estimate = await calibrate(ctx, route, settings[i] as (typeof settings)[number]);
    perSlice.push(Math.ceil(estimate * ROUTE_SLICE_SEC * 2) + 200);
  }
  for (let attempt = 0; attempt < 3; attempt++) {
    const runs: { files: string[]; signed: number; signSec: number }[] = [];
    for (const [i, route] of routes.entries()) {
      const signStart = performance.now();
      const count = perSlice[i] as number;
      const requests = await route.build(count * slices);
      const files = Array.from({ length: slices }, (_, k) => {
        const file = ctx.requestFile();
        writeRequestFile(file, requests.slice(k * count, (k + 1) * count));
        return file;
      });
      runs.push({ files, signed: requests.length, signSec: (performance.now() - signStart) / 1000 });
    }
    const tallies = routes.map(() => new SliceTally());
    let ranOut = -1;
    for (let k = 0; k < slices && ranOut < 0; k++) {
      for (const [i, route] of routes.entries()) {
        const tally = tallies[i] as SliceTally;
        const { cpus, connections } = settings[i] as (typeof settings)[number];
        const result = await tally.routeSlice(route.target.pid, () =>
          runWrk({
            url: route.target.url,
            file: runs[i]?.files[k] as string,
            durationSec: ROUTE_SLICE_SEC,
            connections,
            cpus,
          }),
        );
        if (result.exhausted > 0) {
          ranOut = i;
          break;
        }
        // The server finishes what the slice left (requests in flight, the WAL checkpointer)
        // before the floor runs on its core; that time and CPU are the route's.
        await settle(route.target.pid);
        addTally(tally.floor, await floor.slice((ROUTE_SLICE_SEC * 1000) / 2, ROUTE_SLICE_SEC / 2));
        tally.endSlice(route.target.pid);
      }
    }
    if (ranOut >= 0) {
      ctx.log(`  ${routes[ranOut]?.name}: a slice's ${perSlice[ranOut]} requests ran out; signing more`);
      perSlice[ranOut] = Math.ceil((perSlice[ranOut] as number) * 1.8);
      continue;
    }
    return routes.map((route, i) =>
      (tallies[i] as SliceTally).result(route.name, runs[i] as { signed: number; signSec: number }),
    );
  }
  throw new Error(`${routes.map((route) => route.name).join(", ")}: the request files kept running out`);
}

/** The calibrated rate (req/s) of a route: a short run, which is also its warm-up. */
async function calibrate(
  ctx: RunContext,
  route: SlicedRoute,
  settings: { cpus: string | null; connections: number },
): Promise<number> {
  let estimate = route.options.estimate;
  if (route.options.calibrate === false) return estimate;
  for (let attempt = 0; attempt < 4; attempt++) {
    const file = ctx.requestFile();
    writeRequestFile(file, await route.build(Math.ceil(estimate * ctx.config.calibrateSec * 2) + 200));
    const calibration = await runWrk({
      url: route.target.url,
      file,
      durationSec: ctx.config.calibrateSec,
      ...settings,
    });
    // A fresh server calibrates below its pace (its JIT is still cold): the caller's estimate,
    // when higher, sizes the files instead (larger files cost signing time, not a rerun).
    if (calibration.exhausted === 0) return Math.max(calibration.rps, route.options.estimate);
    estimate *= 4;
  }
  return estimate;
}

/**
 * Waits until the server is idle: under 5% of a core over each of two consecutive 25 ms windows
 * (its threads' time on a CPU from /proc/<pid>/task/<tid>/schedstat, in nanoseconds: /proc/<pid>/stat
 * counts 10 ms ticks, too coarse to tell), at most half a second.
 */
async function settle(pid: number): Promise<void> {
  const deadline = performance.now() + 500;
  let last = onCpuNs(pid);
  let quiet = 0;
  while (quiet < 2 && performance.now() < deadline) {
    await Bun.sleep(25);
    const now = onCpuNs(pid);
    quiet = now - last < 0.05 * 25e6 ? quiet + 1 : 0;
    last = now;
  }
}

/** Nanoseconds all of a process's threads have spent on a CPU. */
function onCpuNs(pid: number): number {
  let total = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      total += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[0]);
    } catch {
      // The thread ended between the listing and the read.
    }
  }
  return total;
}

/** What one route's slices add up to. */
class SliceTally {
  readonly runs: WrkResult[] = [];
  readonly floor = emptyTally();
  /** The server's CPU from each slice's start to the end of the floor slice after it. */
  private chargedCpu = 0;
  private sliceCpu = 0;
  private wallSec = 0;
  private otherSec = 0;
  private first: ProcSample | undefined;
  private last: ProcSample | undefined;
  private sliceStart: ProcSample | undefined;

  async routeSlice(pid: number, run: () => Promise<WrkResult>): Promise<WrkResult> {
    const before = sample(pid);
    this.first ??= before;
    this.sliceStart = before;
    const busyBefore = machineBusySeconds();
    const selfBefore = process.cpuUsage();
    const result = await run();
    const after = sample(pid);
    const self = process.cpuUsage(selfBefore);
    const serverCpu = after.cpuSec - before.cpuSec;
    this.runs.push(result);
    this.sliceCpu += serverCpu;
    this.wallSec += (after.at - before.at) / 1000;
    this.otherSec +=
      machineBusySeconds() - busyBefore - serverCpu - result.loadgenCpuSec - (self.user + self.system) / 1e6;
    return result;
  }

  endSlice(pid: number): void {
    const end = sample(pid);
    this.chargedCpu += end.cpuSec - (this.sliceStart?.cpuSec ?? end.cpuSec);
    this.last = end;
  }

  result(name: string, signing: { signed: number; signSec: number }): RouteRun {
    const merged = mergeWrk(this.runs);
    const measuredFloor = floorOf(this.floor);
    const first = this.first as ProcSample;
    const last = this.last ?? first;
    return {
      name,
      wrk: merged,
      cpuPct: (this.sliceCpu / merged.durationSec) * 100,
      // What a request left for later (in flight when wrk stopped, the WAL checkpointer, a sweep)
      // is charged to the route too: each slice's CPU runs to the end of the floor slice after it.
      cpuUsPerRequest: (this.chargedCpu / Math.max(1, merged.requests)) * 1e6,
      rssBeforeMiB: first.rssMiB,
      rssAfterMiB: last.rssMiB,
      hwmMiB: last.hwmMiB,
      otherPct: Math.max(0, (this.otherSec / this.wallSec) * 100),
      signedRequests: signing.signed,
      signSec: signing.signSec,
      floor: measuredFloor.ops,
      httpUs: measuredFloor.httpUs,
      floorTally: this.floor,
    };
  }
}

export function describeRun(run: RouteRun): string {
  const w = run.wrk;
  const statuses = Object.entries(w.statuses)
    .map(([code, n]) => `${code}:${n}`)
    .join(" ");
  return `${run.name}: ${thousands(w.rps)} req/s, p50 ${fixed(w.latencyMs.p50, 2)} ms, p99 ${fixed(w.latencyMs.p99, 2)} ms, p99.9 ${fixed(w.latencyMs.p999, 2)} ms, non-2xx ${w.non2xx}, socket errors ${w.socketErrors}, server CPU ${fixed(run.cpuPct)}% (${fixed(run.cpuUsPerRequest)} µs/req), RSS ${fixed(run.rssBeforeMiB)}→${fixed(run.rssAfterMiB)} MiB, other CPU ${fixed(run.otherPct)}% [${statuses}]`;
}
