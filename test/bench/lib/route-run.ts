import { join } from "node:path";
import { freePort } from "../../e2e/binary.ts";
import { cpuPercent, machineBusySeconds, sample } from "./procstat.ts";
import { fixed, thousands } from "./report.ts";
import { type BenchRequest, writeRequestFile } from "./requests.ts";
import type { RunContext } from "./run-context.ts";
import { pinned } from "./server.ts";
import { runWrk, type WrkResult } from "./wrk.ts";

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
 * One route, closed loop with wrk. Calibrates (a short run, which is also the warm-up), then signs
 * enough requests for `durationSec` at the calibrated rate plus a margin, right before the run, so
 * every timestamp is well inside the 300 s window; re-runs with a bigger file if wrk ran out.
 */
export async function measure(
  ctx: RunContext,
  name: string,
  target: Target,
  build: (n: number) => BenchRequest[] | Promise<BenchRequest[]>,
  options: MeasureOptions,
): Promise<RouteRun> {
  const { config } = ctx;
  const durationSec = options.durationSec ?? config.durationSec;
  const cpus = options.cpus === undefined ? ctx.loadCpus : options.cpus;
  const connections = options.connections ?? config.connections;
  const file = ctx.requestFile();
  let estimate = options.estimate;
  for (let attempt = 0; attempt < 4 && options.calibrate !== false; attempt++) {
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
  let count = Math.ceil(estimate * durationSec * 1.6) + 500;
  for (let attempt = 0; attempt < 3; attempt++) {
    const signStart = performance.now();
    const signedRequests = writeRequestFile(file, await build(count));
    const signSec = (performance.now() - signStart) / 1000;
    const before = sample(target.pid);
    const busyBefore = machineBusySeconds();
    const selfBefore = process.cpuUsage();
    const result = await runWrk({ url: target.url, file, durationSec, connections, cpus });
    const after = sample(target.pid);
    const self = process.cpuUsage(selfBefore);
    const busy = machineBusySeconds() - busyBefore;
    if (result.exhausted > 0) {
      ctx.log(`  ${name}: the ${signedRequests} requests ran out after ${result.sent}; signing more`);
      count = Math.ceil(count * 1.8);
      continue;
    }
    const wallSec = (after.at - before.at) / 1000;
    const serverCpu = after.cpuSec - before.cpuSec;
    const other = busy - serverCpu - result.loadgenCpuSec - (self.user + self.system) / 1e6;
    return {
      name,
      wrk: result,
      cpuPct: cpuPercent(before, after),
      cpuUsPerRequest: (serverCpu / Math.max(1, result.requests)) * 1e6,
      rssBeforeMiB: before.rssMiB,
      rssAfterMiB: after.rssMiB,
      hwmMiB: after.hwmMiB,
      otherPct: Math.max(0, (other / wallSec) * 100),
      signedRequests,
      signSec,
    };
  }
  throw new Error(`${name}: the request file kept running out`);
}

export function describeRun(run: RouteRun): string {
  const w = run.wrk;
  const statuses = Object.entries(w.statuses)
    .map(([code, n]) => `${code}:${n}`)
    .join(" ");
  return `${run.name}: ${thousands(w.rps)} req/s, p50 ${fixed(w.latencyMs.p50, 2)} ms, p99 ${fixed(w.latencyMs.p99, 2)} ms, p99.9 ${fixed(w.latencyMs.p999, 2)} ms, non-2xx ${w.non2xx}, socket errors ${w.socketErrors}, server CPU ${fixed(run.cpuPct)}% (${fixed(run.cpuUsPerRequest)} µs/req), RSS ${fixed(run.rssBeforeMiB)}→${fixed(run.rssAfterMiB)} MiB, other CPU ${fixed(run.otherPct)}% [${statuses}]`;
}

// The floor: what every request of a route cannot avoid, on one core of this machine.

/** µs per operation from floor-ops.ts. */
export interface FloorOps {
  verify_us: number;
  sign_us: number;
  read_us: number;
  write_us: number;
  append_us: number;
  page50_us: number;
  /** The writes each route cannot do without, in one transaction (the activation floor counts them). */
  heartbeat_write_us: number;
  activation_write_us: number;
}

export function floorOps(ctx: RunContext): FloorOps {
  const result = Bun.spawnSync(pinned(ctx.serverCpus, [ctx.bun, join(ctx.benchDir, "floor-ops.ts")]), {
    stdout: "pipe",
    stderr: "pipe",
  });
  if (result.exitCode !== 0) throw new Error(`floor-ops failed: ${result.stderr.toString()}`);
  return JSON.parse(result.stdout.toString().trim().split("\n").pop() ?? "{}") as FloorOps;
}

/** A bare Bun.serve answering `responseBytes` of JSON, driven like a route (floor-http.ts). */
export async function httpFloor(
  ctx: RunContext,
  responseBytes: number,
  requests: (n: number) => BenchRequest[],
): Promise<RouteRun> {
  const port = await freePort();
  const proc = Bun.spawn(
    pinned(ctx.serverCpus, [
      ctx.bun,
      join(ctx.benchDir, "floor-http.ts"),
      String(port),
      String(responseBytes),
    ]),
    { stdout: "ignore", stderr: "inherit" },
  );
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 200; i++) {
    try {
      if ((await fetch(`${url}/`)).status === 200) break;
    } catch {
      await Bun.sleep(25);
    }
  }
  try {
    return await measure(ctx, "HTTP + JSON floor", { pid: proc.pid, url }, requests, { estimate: 30_000 });
  } finally {
    proc.kill("SIGTERM");
    await proc.exited;
  }
}
