import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { EXECUTABLE, ensureExecutable, isExecutableStale } from "../../../build/compile.ts";
import { api, cleanEnv, type HttpResult } from "../../e2e/binary.ts";
import { memoryMiB } from "./procstat.ts";

/**
 * The executable under test: BENCH_BINARY when set (to compare builds, or to bench a snapshot while
 * the working tree is being edited), else build/out/licensing.
 */
export const binaryPath = (): string => process.env.BENCH_BINARY || EXECUTABLE;

/** Builds build/out/licensing when it is missing or older than a source; says what it did. */
export function ensureBinary(log: (line: string) => void): string {
  if (process.env.BENCH_BINARY) {
    if (!existsSync(process.env.BENCH_BINARY))
      throw new Error(`BENCH_BINARY ${process.env.BENCH_BINARY} does not exist`);
    return process.env.BENCH_BINARY;
  }
  if (isExecutableStale()) {
    log(`building ${EXECUTABLE} (missing or stale) ...`);
    const started = performance.now();
    ensureExecutable();
    log(`built in ${((performance.now() - started) / 1000).toFixed(1)} s`);
  }
  return EXECUTABLE;
}

/** wrk comes from Debian's packages; installed when absent (the bench runs as root). */
export function ensureWrk(log: (line: string) => void): void {
  if (Bun.which("wrk")) return;
  log("wrk is not installed: apt-get install -y wrk ...");
  const apt = (args: string[]) =>
    Bun.spawnSync(["apt-get", ...args], {
      stdout: "pipe",
      stderr: "pipe",
      env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" },
    });
  // The package lists may be missing or old on a fresh machine: update once, then install.
  if (apt(["install", "-y", "wrk"]).exitCode !== 0) {
    apt(["update"]);
    const installed = apt(["install", "-y", "wrk"]);
    if (installed.exitCode !== 0) {
      throw new Error(
        `apt-get install -y wrk failed:\n${installed.stdout.toString()}${installed.stderr.toString()}`,
      );
    }
  }
  if (!Bun.which("wrk")) throw new Error("wrk is still not on PATH after apt-get install");
}

/**
 * `taskset -c CPUS` prefix, or nothing where there is only one core to use; with BENCH_NICE=-10
 * (say) also `nice -n -10`, so that other work on a shared machine disturbs the bench less (and gets
 * less CPU while it runs: opt-in).
 */
export const pinned = (cpus: string | null, command: string[]): string[] => {
  const nice = process.env.BENCH_NICE ? ["nice", "-n", process.env.BENCH_NICE] : [];
  return cpus === null ? [...nice, ...command] : ["taskset", "-c", cpus, ...nice, ...command];
};

export async function runCli(args: string[]): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const proc = Bun.spawn([binaryPath(), ...args], {
    env: cleanEnv(),
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  const [stdout, stderr, exitCode] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ]);
  return { exitCode, stdout, stderr };
}

/**
 * What the hot-path tools (threads, latency, profile) start with: this process moved to the load
 * generators' core (the last one), and a fresh data dir made by `licensing init`; returns its live
 * API key.
 */
export async function initToolStore(dataDir: string): Promise<string> {
  Bun.spawnSync(["taskset", "-a", "-p", "-c", "1", String(process.pid)], { stdout: "ignore" });
  const init = await runCli(["init", "--data-dir", dataDir, "--json"]);
  return JSON.parse(init.stdout).api_keys.live as string;
}

/**
 * The server environment of the hot-path tools: one address drives everything, so the runtime
 * burst windows are off (they would measure themselves), and JavaScriptCore's and the allocator's
 * own variables (`BUN_JSC_*`, e.g. `BUN_JSC_useFTLJIT=false`, Bun's GC timer `BUN_GC_*` and
 * `MIMALLOC_*`) reach the server,
 * to try them.
 */
export function toolServerEnv(extra: Record<string, string> = {}): Record<string, string> {
  const engine = Object.entries(process.env).filter(
    ([name]) => name.startsWith("BUN_JSC_") || name.startsWith("BUN_GC_") || name.startsWith("MIMALLOC_"),
  ) as [string, string][];
  return {
    LICENSING_RUNTIME_RATE_LIMIT_IP: "off",
    LICENSING_RUNTIME_RATE_LIMIT_ACTIVATION: "off",
    LICENSING_RUNTIME_RATE_LIMIT_LICENSE: "off",
    ...Object.fromEntries(engine),
    ...extra,
  };
}

export interface BenchServer {
  pid: number;
  url: string;
  port: number;
  /** Spawn to the first 200 from /readyz. */
  startupMs: number;
  logPath: string;
  proc: Subprocess;
  threads(): number;
  stop(signal?: NodeJS.Signals): Promise<number>;
}

let starts = 0;

/**
 * `licensing serve` pinned to `cpus`, its stdout and its JSON request log (stderr) going to files in
 * `logDir`, as an operator would run it. Waits for /readyz.
 */
export async function startServer(options: {
  dataDir: string;
  port: number;
  cpus: string | null;
  logDir: string;
  /** The command to run instead of the executable (profile.ts runs the sources with --cpu-prof). */
  command?: string[];
  /** Extra environment for `serve` (configuration such as the rate limits). */
  env?: Record<string, string>;
}): Promise<BenchServer> {
  const n = ++starts;
  const logPath = join(options.logDir, `serve-${n}.log`);
  const started = performance.now();
  const proc = Bun.spawn(
    pinned(options.cpus, [
      ...(options.command ?? [binaryPath()]),
      "serve",
      "--data-dir",
      options.dataDir,
      "--port",
      String(options.port),
    ]),
    {
      env: cleanEnv(options.env),
      stdin: "ignore",
      stdout: Bun.file(join(options.logDir, `serve-${n}.out`)),
      stderr: Bun.file(logPath),
    },
  );
  const url = `http://127.0.0.1:${options.port}`;
  const deadline = Date.now() + 120_000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) break;
    try {
      const response = await fetch(`${url}/readyz`);
      if (response.status === 500) {
        proc.kill("SIGKILL");
        await proc.exited;
        throw new Error(`the server answers /readyz with 500; see ${logPath}`);
      }
      if (response.status === 200) {
        const startupMs = performance.now() - started;
        return {
          pid: proc.pid,
          url,
          port: options.port,
          startupMs,
          logPath,
          proc,
          threads: () =>
            existsSync(`/proc/${proc.pid}/task`) ? readdirSync(`/proc/${proc.pid}/task`).length : 0,
          async stop(signal = "SIGTERM") {
            proc.kill(signal);
            // A server that does not stop within its drain time is killed, so one stuck shutdown
            // cannot hang the whole bench run (the exit code then says SIGKILL).
            const stopped = await Promise.race([proc.exited, Bun.sleep(STOP_GRACE_MS).then(() => null)]);
            if (stopped !== null) return stopped;
            proc.kill("SIGKILL");
            return await proc.exited;
          },
        };
      }
    } catch (error) {
      // Not listening yet.
      if ((error as Error).message.includes("answers /readyz")) throw error;
    }
    await Bun.sleep(5);
  }
  proc.kill("SIGKILL");
  await proc.exited;
  throw new Error(`the server did not become ready (exit ${proc.exitCode}); see ${logPath}`);
}

/** Longer than the server's own shutdown drain (a few seconds), so a clean stop is never cut short. */
const STOP_GRACE_MS = 30_000;

export const rssOf = (server: BenchServer) => memoryMiB(server.pid);

/** Store + WAL + shared-memory file sizes, bytes. */
export function storeBytes(dataDir: string): number {
  let total = 0;
  for (const suffix of ["", "-wal", "-shm"]) {
    const path = join(dataDir, `licensing.db${suffix}`);
    if (existsSync(path)) total += statSync(path).size;
  }
  return total;
}

/** A Management API call that waits out 429s (the per-key limit is 100/s), and fails on other errors. */
export async function mgmt(
  url: string,
  key: string,
  method: string,
  path: string,
  body?: unknown,
  expect: number[] = [200, 201],
): Promise<HttpResult> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const result = await api(url, key, method, path, body);
    if (result.status === 429) {
      await Bun.sleep(Number(result.headers.get("retry-after") ?? 1) * 1000);
      continue;
    }
    if (!expect.includes(result.status)) {
      throw new Error(`${method} ${path} answered ${result.status}: ${JSON.stringify(result.body)}`);
    }
    return result;
  }
  throw new Error(`${method} ${path}: still rate limited`);
}
