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
}

interface RawWrk {
  requests: number;
  duration_us: number;
  statuses: Record<string, number>;
  exhausted: number;
  sent: number;
  errors: { connect: number; read: number; write: number; status: number; timeout: number };
  latency_us: { mean: number; max: number; p50: number; p90: number; p99: number; p999: number };
}

/** Replays FILE against URL with wrk (closed loop: `connections` requests in flight) for `durationSec`. */
export async function runWrk(options: {
  url: string;
  file: string;
  durationSec: number;
  connections: number;
  threads?: number;
  cpus: string | null;
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
  const raw = JSON.parse(line.slice("BENCH_JSON ".length)) as RawWrk;
  const durationSec = raw.duration_us / 1e6;
  const non2xx = Object.entries(raw.statuses)
    .filter(([code]) => !code.startsWith("2"))
    .reduce((sum, [, n]) => sum + n, 0);
  const ms = (us: number) => us / 1000;
  return {
    requests: raw.requests,
    durationSec,
    rps: raw.requests / durationSec,
    statuses: raw.statuses,
    non2xx,
    socketErrors: raw.errors.connect + raw.errors.read + raw.errors.write + raw.errors.timeout,
    exhausted: raw.exhausted,
    sent: raw.sent,
    loadgenCpuSec: Number(proc.resourceUsage()?.cpuTime.total ?? 0) / 1e6,
    latencyMs: {
      mean: ms(raw.latency_us.mean),
      p50: ms(raw.latency_us.p50),
      p90: ms(raw.latency_us.p90),
      p99: ms(raw.latency_us.p99),
      p999: ms(raw.latency_us.p999),
      max: ms(raw.latency_us.max),
    },
  };
}
