import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "../e2e/binary.ts";
import { activateDevices, createFixture } from "./lib/fixture.ts";
import { threadCpu } from "./lib/procstat.ts";
import { heartbeatRequest, pickFrom, writeRequestFile } from "./lib/requests.ts";
import { ensureBinary, initToolStore, pinned, startServer, toolServerEnv } from "./lib/server.ts";
import { quantile } from "./lib/stats.ts";
import { readServerLog, slowAfter, watchSteal } from "./lib/tail.ts";

/**
 * The open-model heartbeat latency run alone (the "latency under load" part of `npm run bench`),
 * for quick before/after comparisons of the tail: the server pinned to core 0, the open-loop
 * generator on core 1, heartbeats from random devices at a fixed rate.
 *
 * Usage: bun test/bench/latency.ts RATE [SECONDS]
 * LATENCY_SOURCES=1 serves from this checkout's sources instead of the compiled binary;
 * LATENCY_TIMELINE=1 prints, per 100 ms of the server's log, the requests over 10 ms and the WAL
 * restarts; LATENCY_SERVER_CPUS (default 0) where the server may run; LATENCY_KEEP=1 keeps the
 * work directory (server log included); BUN_JSC_* variables (e.g. BUN_JSC_logGC=1) reach the server;
 * LATENCY_PROFILE=<dir> serves the sources under Bun's profiler and writes a .cpuprofile there;
 * LATENCY_WARM_UP_SEC (30) the unmeasured run at the same rate before it. It also says how many of
 * the slow requests came just after a WAL restart or after steal on the server's core (lib/tail.ts).
 */
const rate = Number(process.argv[2] ?? 1200);
const seconds = Number(process.argv[3] ?? 15);
const fromSources = process.env.LATENCY_SOURCES === "1";
const serverCpus = process.env.LATENCY_SERVER_CPUS ?? "0";
const warmUpSec = Number(process.env.LATENCY_WARM_UP_SEC ?? 30);
if (!fromSources) ensureBinary((line) => console.log(line));
const work = mkdtempSync(join(tmpdir(), "licensing-latency-"));
const dataDir = join(work, "data");
const liveKey = await initToolStore(dataDir);
const server = await startServer({
  dataDir,
  port: await freePort(),
  // LATENCY_SERVER_CPUS=0,1: the server may use both cores (its helper threads then need not
  // preempt the request thread), sharing core 1 with the generator.
  cpus: serverCpus,
  logDir: work,
  // debug: the server logs every WAL restart and how long it held the writes.
  env: toolServerEnv({ LICENSING_LOG_LEVEL: "debug" }),
  command: process.env.LATENCY_PROFILE
    ? [
        process.execPath,
        "--cpu-prof",
        `--cpu-prof-dir=${process.env.LATENCY_PROFILE}`,
        join(import.meta.dir, "..", "..", "src/main.ts"),
      ]
    : fromSources
      ? [process.execPath, join(import.meta.dir, "..", "..", "src/main.ts")]
      : undefined,
});
try {
  const fixture = await createFixture(server.url, liveKey, 1);
  const devices = await activateDevices(server.url, fixture, Number(process.env.LATENCY_DEVICES ?? 3000), 16);
  // Both request files are signed first, so the measured run follows the warm-up without a pause
  // (signed requests stay valid for 300 s: warm-up and run must fit in that).
  const requests = (name: string, sec: number) => {
    const file = join(work, `${name}.txt`);
    writeRequestFile(
      file,
      Array.from({ length: Math.ceil(rate * sec) + 10 }, () => heartbeatRequest(pickFrom(devices))),
    );
    return file;
  };
  if (warmUpSec + seconds > 240) throw new Error("LATENCY_WARM_UP_SEC + SECONDS must stay within 240 s");
  const warmUpFile = requests("warm-up", warmUpSec);
  const measuredFile = requests("open-loop", seconds);
  const openLoop = async (file: string, sec: number) => {
    const proc = Bun.spawn(
      pinned("1", [
        process.execPath,
        join(import.meta.dir, "open-loop.ts"),
        server.url,
        file,
        String(rate),
        String(sec),
      ]),
      { stdout: "pipe", stderr: "inherit" },
    );
    const stdout = await new Response(proc.stdout).text();
    await proc.exited;
    return stdout.trim();
  };
  // Warm: every device's key is imported, and the JIT has compiled the heartbeat path. On a fresh
  // server JavaScriptCore compiles the path's largest functions in its optimising tier 20-35 s
  // after the first heartbeats (50-250 ms compiles on the server's one core), so the default
  // warm-up is long enough to leave them out of the measured run (docs/performance.md).
  await openLoop(warmUpFile, warmUpSec);
  const logFrom = statSync(server.logPath).size;
  const before = threadCpu(server.pid);
  // Steal is sampled on the first of the server's CPUs (the only one unless LATENCY_SERVER_CPUS).
  const stealCpu = Number(serverCpus.split(/[,-]/)[0]);
  const steal = watchSteal(stealCpu);
  console.log(await openLoop(measuredFile, seconds));
  const stolen = steal.stop();
  const after = threadCpu(server.pid);
  const perThread = [...after]
    .map(([tid, { name, cpuSec, systemSec }]) => ({
      name,
      us: ((cpuSec - (before.get(tid)?.cpuSec ?? 0)) * 1e6) / (rate * seconds),
      kernelUs: ((systemSec - (before.get(tid)?.systemSec ?? 0)) * 1e6) / (rate * seconds),
    }))
    .filter((t) => t.us > 0.5)
    .sort((a, b) => b.us - a.us);
  console.log(
    `server CPU per request: ${perThread.reduce((sum, t) => sum + t.us, 0).toFixed(1)} µs (${perThread.map((t) => `${t.name} ${t.us.toFixed(1)}, ${t.kernelUs.toFixed(1)} in the kernel`).join("; ")})`,
  );
  const log = readServerLog(server.logPath, logFrom);
  const held = log.restarts.map((r) => r.writesHeldMs).sort((a, b) => a - b);
  console.log(
    `wal restarts: ${log.restarts.length} (${log.restarts.filter((r) => !r.caughtUp).length} not caught up), writes held p50 ${held.length > 0 ? quantile(held, 0.5) : "-"} ms, max ${held[held.length - 1] ?? "-"} ms`,
  );
  console.log(
    `inside the server: ${log.durations.length} requests, p50 ${quantile(log.durations, 0.5)} ms, p99 ${quantile(log.durations, 0.99)} ms, max ${log.durations[log.durations.length - 1] ?? "-"} ms, over 10 ms: ${log.slowAt.length}`,
  );
  const afterRestart = slowAfter(
    log.slowAt,
    log.restarts.map((r) => r.at),
  );
  const afterSteal = slowAfter(log.slowAt, stolen.at);
  console.log(
    `of those over 10 ms: ${afterRestart.near} completed just after a WAL restart (${afterRestart.chance} by chance), ${afterSteal.near} just after steal on CPU ${stealCpu} (${afterSteal.chance} by chance; ${stolen.stealMs} ms of steal in all)`,
  );
  if (process.env.LATENCY_TIMELINE === "1") {
    const logged = readFileSync(server.logPath).subarray(logFrom).toString("utf8").split("\n");
    // When the slow requests happened: per 100 ms of the server's log, the slowest and the restarts.
    const windows = new Map<number, { slow: number; max: number; restarts: number }>();
    for (const line of logged) {
      if (!line.startsWith("{")) continue;
      const entry = JSON.parse(line) as { ts: string; msg: string; duration_ms?: number };
      const w = Math.floor(Date.parse(entry.ts) / 100);
      const window = windows.get(w) ?? { slow: 0, max: 0, restarts: 0 };
      if (entry.msg === "wal restart") window.restarts++;
      if (entry.msg === "request" && entry.duration_ms !== undefined) {
        window.max = Math.max(window.max, entry.duration_ms);
        if (entry.duration_ms > 10) window.slow++;
      }
      windows.set(w, window);
    }
    for (const [w, window] of [...windows].sort((a, b) => a[0] - b[0]))
      if (window.slow > 0 || window.restarts > 0)
        console.log(
          `${new Date(w * 100).toISOString().slice(11, 22)} slow ${window.slow} max ${window.max} ms restarts ${window.restarts}`,
        );
  }
} finally {
  await server.stop("SIGTERM");
  if (process.env.LATENCY_KEEP === "1") console.log(`kept ${work}`);
  else rmSync(work, { recursive: true, force: true });
}
