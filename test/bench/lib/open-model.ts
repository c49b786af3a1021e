import { statSync } from "node:fs";
import { join } from "node:path";
import { cpuPercent, sample } from "./procstat.ts";
import { type BenchDevice, heartbeatRequest, pickFrom, writeRequestFile } from "./requests.ts";
import type { RunContext } from "./run-context.ts";
import { type BenchServer, pinned } from "./server.ts";
import { quantile } from "./stats.ts";
import { readServerLog, type SlowAfter, slowAfter, watchSteal } from "./tail.ts";

export interface OpenLoopResult {
  rate: number;
  scheduled: number;
  completed: number;
  failed: number;
  statuses: Record<string, number>;
  achieved_rps: number;
  connections: number;
  max_in_flight: number;
  latency_ms: { p50: number; p90: number; p99: number; p999: number; max: number };
  send_lateness_ms: { p50: number; p99: number };
  server_cpu_pct: number;
  /** The same requests as the server logged them: time inside the server (no queueing, no network). */
  server_logged: { count: number; p99: number; max: number; over10: number };
  /** Where the slow requests came from: a stall shortly before them (lib/tail.ts). */
  tail: {
    /** Steal on the server's core during the run: its hypervisor ran something else. */
    steal_ms: number;
    after_steal: SlowAfter;
    wal_restarts: number;
    after_restart: SlowAfter;
  };
}

/**
 * Latency under load: heartbeats from random devices at a fixed rate (open-loop.ts), after an
 * unmeasured warm-up at the same rate, with the server's own log and the steal on its core.
 */
export async function openLoop(
  ctx: RunContext,
  server: BenchServer,
  devices: BenchDevice[],
  rate: number,
): Promise<OpenLoopResult> {
  const { config } = ctx;
  // A warm-up at the same rate first, unmeasured. While the other routes ran (about 90 s), the
  // heartbeat's optimised code went unused, and JavaScriptCore drops such code (code aging); it is
  // compiled again once heartbeats resume, the largest function (Elysia's handler for the route)
  // in its optimising tier some 8 s later, a 50-100 ms compile on the server's one core. That is
  // the price of the bench's route order, not the steady state this run is about: 15 s covers it
  // (docs/performance.md). Both request files are written first, so the measured run follows the
  // warm-up without a pause.
  // Signed requests are accepted for 300 s after their timestamp: warm-up and run must fit in it.
  if (config.openLoopWarmUpSec + config.openLoopSec > 240)
    throw new Error("BENCH_OPEN_LOOP_WARM_UP_SEC + BENCH_OPEN_LOOP_SEC must stay within 240 s");
  const warmUp = writeOpenLoopRequests(ctx, devices, rate, config.openLoopWarmUpSec, "open-loop-warm-up.txt");
  const measured = writeOpenLoopRequests(ctx, devices, rate, config.openLoopSec, "open-loop.txt");
  await runOpenLoop(ctx, server, warmUp, rate, config.openLoopWarmUpSec);
  const before = sample(server.pid);
  const logFrom = statSync(server.logPath).size;
  const steal = watchSteal(Number(ctx.serverCpus ?? 0));
  const { stdout } = await runOpenLoop(ctx, server, measured, rate, config.openLoopSec);
  const stolen = steal.stop();
  const after = sample(server.pid);
  const log = readServerLog(server.logPath, logFrom);
  return {
    ...(JSON.parse(stdout.trim()) as Omit<OpenLoopResult, "server_cpu_pct" | "server_logged" | "tail">),
    server_cpu_pct: cpuPercent(before, after),
    server_logged: {
      count: log.durations.length,
      p99: quantile(log.durations, 0.99),
      max: log.durations[log.durations.length - 1] ?? Number.NaN,
      over10: log.slowAt.length,
    },
    tail: {
      steal_ms: stolen.stealMs,
      after_steal: slowAfter(log.slowAt, stolen.at),
      wal_restarts: log.restarts.length,
      after_restart: slowAfter(
        log.slowAt,
        log.restarts.map((restart) => restart.at),
      ),
    },
  };
}

/** Heartbeats from random devices for `seconds` at `rate`, signed now; returns the file. */
function writeOpenLoopRequests(
  ctx: RunContext,
  devices: BenchDevice[],
  rate: number,
  seconds: number,
  fileName: string,
): string {
  const file = join(ctx.work, fileName);
  const count = Math.ceil(rate * seconds) + 10;
  writeRequestFile(
    file,
    Array.from({ length: count }, () => heartbeatRequest(pickFrom(devices))),
  );
  return file;
}

async function runOpenLoop(
  ctx: RunContext,
  server: BenchServer,
  file: string,
  rate: number,
  seconds: number,
): Promise<{ stdout: string }> {
  const proc = Bun.spawn(
    pinned(ctx.loadCpus, [
      ctx.bun,
      join(ctx.benchDir, "open-loop.ts"),
      server.url,
      file,
      String(rate),
      String(seconds),
    ]),
    { stdout: "pipe", stderr: "pipe" },
  );
  const [stdout, stderr, exitCode] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ]);
  if (exitCode !== 0) throw new Error(`open-loop failed (exit ${exitCode}): ${stderr}`);
  return { stdout };
}

/** The open-model run's slow requests set against the stalls just before them (lib/tail.ts). */
export const tailLine = (open: OpenLoopResult) => {
  const { tail } = open;
  return `${tail.after_restart.near} completed just after one of the ${tail.wal_restarts} WAL restarts (${tail.after_restart.chance} by chance) and ${tail.after_steal.near} just after steal on the server's core (${tail.after_steal.chance} by chance; ${tail.steal_ms} ms of steal in all)`;
};
