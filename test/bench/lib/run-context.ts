import { mkdirSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { freePort } from "../../e2e/binary.ts";
import { type MachineInfo, machineBusySeconds, machineInfo } from "./procstat.ts";
import { fixed } from "./report.ts";
import { type BenchServer, startServer, toolServerEnv } from "./server.ts";

/**
 * What every part of `npm run bench` shares: its settings, the CPU layout, the work directory and
 * the servers it started. Environment: BENCH_SCALE=0 skips the 1M-activation part; BENCH_DEVICES
 * (10000), BENCH_DURATION (seconds per route, 12), BENCH_CONNECTIONS (32), BENCH_SCALE_ROWS
 * (1000000), BENCH_OPEN_LOOP_SEC (20), BENCH_OPEN_LOOP_WARM_UP_SEC (15), BENCH_BINARY (an
 * executable to test instead of build/out/licensing), BENCH_KEEP=1 (keep the temp dir with stores,
 * request files and server logs).
 */
export interface RunConfig {
  devices: number;
  durationSec: number;
  calibrateSec: number;
  connections: number;
  scale: boolean;
  scaleRows: number;
  scaleSample: number;
  openLoopSec: number;
  openLoopWarmUpSec: number;
  keep: boolean;
  licenses: number;
  apiKeys: number;
}

export interface RunContext {
  config: RunConfig;
  machine: MachineInfo;
  /**
   * The server (and the floor's server and micro-benchmarks) on core 0, every load generator (wrk,
   * the open-loop client, the runner) on the last core, so the two never share a core and the
   * server's throughput is a per-core figure, like the floor. null: one core, nothing pinned.
   */
  serverCpus: string | null;
  loadCpus: string | null;
  allCpus: string | null;
  serverEnv: Record<string, string>;
  /** This directory (the bench's scripts). */
  benchDir: string;
  /** The Bun running the bench, used for its child scripts. */
  bun: string;
  /** A fresh temp dir: the store, request files and server logs. */
  work: string;
  dataDir: string;
  log: (line: string) => void;
  /** Seconds since the context was made (the run's start). */
  elapsedSec: () => number;
  /**
   * Starts the server on `dataDir` (or on another data dir: the scale run's copy of the 10k store),
   * pinned; it is killed when the run ends, whatever happens.
   */
  start: (dataDir?: string) => Promise<BenchServer>;
  /** Servers this run started, so a failure part-way never leaves one running. */
  started: Set<BenchServer>;
  /** Other processes to kill when the run ends (the floor's), for the same reason. */
  children: Set<Subprocess>;
  /** A new request file's path in the work dir. */
  requestFile: () => string;
}

function runConfig(env: Record<string, string | undefined>): RunConfig {
  return {
    devices: Number(env.BENCH_DEVICES ?? 10_000),
    durationSec: Number(env.BENCH_DURATION ?? 12),
    calibrateSec: 3,
    connections: Number(env.BENCH_CONNECTIONS ?? 32),
    scale: env.BENCH_SCALE !== "0",
    scaleRows: Number(env.BENCH_SCALE_ROWS ?? 1_000_000),
    scaleSample: 100_000,
    openLoopSec: Number(env.BENCH_OPEN_LOOP_SEC ?? 20),
    openLoopWarmUpSec: Number(env.BENCH_OPEN_LOOP_WARM_UP_SEC ?? 15),
    keep: env.BENCH_KEEP === "1",
    licenses: 100,
    apiKeys: 48,
  };
}

export function createRunContext(env: Record<string, string | undefined>): RunContext {
  const startedAt = performance.now();
  const elapsedSec = () => (performance.now() - startedAt) / 1000;
  const machine = machineInfo();
  const many = machine.cores >= 2;
  const serverCpus = many ? "0" : null;
  const work = mkdtempSync(join(tmpdir(), "licensing-bench-"));
  const dataDir = join(work, "data");
  mkdirSync(join(work, "logs"));
  const started = new Set<BenchServer>();
  // Every request comes from 127.0.0.1 and thousands of devices share a few licenses, so the
  // runtime burst windows (per address, activation and license) would measure the limiter, not
  // the service: they are off, as docs/operations.md "Rate limits" allows. `BUN_JSC_*` and
  // `MIMALLOC_*` variables reach the server, to measure the engine's options (e.g.
  // BUN_JSC_useFTLJIT=false). Debug level adds only the WAL restart lines (about one a second
  // under load), which the open-model part sets against its slow requests.
  const serverEnv = toolServerEnv({ LICENSING_LOG_LEVEL: "debug" });
  let requestFiles = 0;
  return {
    config: runConfig(env),
    machine,
    serverCpus,
    loadCpus: many ? String(machine.cores - 1) : null,
    allCpus: many ? `0-${machine.cores - 1}` : null,
    serverEnv,
    benchDir: join(import.meta.dir, ".."),
    bun: process.execPath,
    work,
    dataDir,
    log: (line) => console.log(`[${elapsedSec().toFixed(0).padStart(4)}s] ${line}`),
    elapsedSec,
    started,
    children: new Set(),
    start: async (dir = dataDir) => {
      const server = await startServer({
        dataDir: dir,
        port: await freePort(),
        cpus: serverCpus,
        logDir: join(work, "logs"),
        env: serverEnv,
      });
      started.add(server);
      return server;
    },
    requestFile: () => join(work, `requests-${++requestFiles}.txt`),
  };
}

/** CPU used by other processes over a few seconds, % of one core: the bench wants a quiet machine. */
export async function foreignLoad(seconds = 3): Promise<number> {
  const busyBefore = machineBusySeconds();
  const self = process.cpuUsage();
  const begin = performance.now();
  await Bun.sleep(seconds * 1000);
  const own = process.cpuUsage(self);
  const busy = machineBusySeconds() - busyBefore - (own.user + own.system) / 1e6;
  return Math.max(0, (busy / ((performance.now() - begin) / 1000)) * 100);
}

export const machineLine = (machine: MachineInfo) =>
  `${machine.cpuModel} (${machine.cpuId}${machine.virtualised ? ", virtual machine" : ""}), ${machine.cores} cores @ ${fixed(machine.cpuMHz)} MHz, ${fixed(machine.memGiB, 1)} GiB RAM, Linux ${machine.kernel}, Bun ${Bun.version}`;

/** The commit the binary was built from (when it is this repository's build), and whether src/ had edits. */
export function sourceCommit(benchDir: string, env: Record<string, string | undefined>): string | null {
  if (env.BENCH_BINARY) return null;
  const head = Bun.spawnSync(["git", "rev-parse", "--short", "HEAD"], { cwd: benchDir, stdout: "pipe" });
  if (head.exitCode !== 0) return null;
  const dirty = Bun.spawnSync(["git", "status", "--porcelain", "--", "src", "db", "build"], {
    cwd: join(benchDir, "..", ".."),
    stdout: "pipe",
  });
  return `${head.stdout.toString().trim()}${dirty.stdout.toString().trim() ? " + uncommitted changes" : ""}`;
}
