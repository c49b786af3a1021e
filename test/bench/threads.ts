import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "../e2e/binary.ts";
import { activateDevices, createFixture } from "./lib/fixture.ts";
import { threadCpu } from "./lib/procstat.ts";
import { heartbeatRequest, pickFrom, writeRequestFile } from "./lib/requests.ts";
import { ensureBinary, ensureWrk, initToolStore, startServer, toolServerEnv } from "./lib/server.ts";
import { sendAll } from "./lib/unmeasured.ts";
import { runWrk } from "./lib/wrk.ts";

/**
 * Where a served heartbeat's CPU goes by thread: the compiled binary pinned to core 0, heartbeats
 * replayed by wrk from core 1, and each thread's CPU time (/proc/<pid>/task) divided by the
 * requests served. The request thread is the one named after the process (or "bun"); the others
 * are Bun's and JavaScriptCore's helpers and the WAL checkpointer (a Worker).
 *
 * Usage: bun test/bench/threads.ts [SECONDS]
 * THREADS_SOURCES=1 serves from this checkout's sources instead of the compiled binary (quick
 * before/after comparisons while editing; the binary is what `npm run bench` measures).
 * THREADS_CONNECTIONS (32) requests in flight: 1 shows what a heartbeat costs alone (its own
 * commit and turns of the event loop), as in the open-model run.
 * THREADS_DEVICES (2000) devices activated before the run; THREADS_WARM_UP=1 sends one heartbeat
 * from each first, as `npm run bench` does before its heartbeat route: with both (10000 and 1)
 * this server is in the state the bench measures its heartbeat in, but for the bench's other
 * preliminaries (100 licenses, 48 API keys, a 3 s calibration run).
 */
const seconds = Number(process.argv[2] ?? 15);
const fromSources = process.env.THREADS_SOURCES === "1";
const connections = Number(process.env.THREADS_CONNECTIONS ?? 32);
const deviceCount = Number(process.env.THREADS_DEVICES ?? 2000);
const warmUp = process.env.THREADS_WARM_UP === "1";
const log = (line: string) => console.log(line);
if (!fromSources) ensureBinary(log);
ensureWrk(log);
const work = mkdtempSync(join(tmpdir(), "licensing-threads-"));
const dataDir = join(work, "data");
const liveKey = await initToolStore(dataDir);
const server = await startServer({
  dataDir,
  port: await freePort(),
  cpus: "0",
  logDir: work,
  env: toolServerEnv(),
  command: fromSources ? [process.execPath, join(import.meta.dir, "..", "..", "src/main.ts")] : undefined,
});
try {
  const fixture = await createFixture(server.url, liveKey, 1);
  const devices = await activateDevices(server.url, fixture, deviceCount, 16);
  if (warmUp) {
    const warm = await sendAll(
      server.url,
      devices.map((device) => heartbeatRequest(device)),
    );
    console.log(`warm-up: one heartbeat from each of ${devices.length} devices ${JSON.stringify(warm)}`);
  }
  const pick = () => pickFrom(devices);
  const file = join(work, "requests.txt");
  writeRequestFile(
    file,
    Array.from({ length: seconds * 6000 }, () => heartbeatRequest(pick())),
  );
  const before = threadCpu(server.pid);
  const result = await runWrk({ url: server.url, file, durationSec: seconds, connections, cpus: "1" });
  const after = threadCpu(server.pid);
  const requests = result.rps * seconds;
  console.log(`heartbeat: ${result.rps.toFixed(0)} req/s, statuses ${JSON.stringify(result.statuses)}`);
  let total = 0;
  const rows: [string, number, number][] = [];
  for (const [tid, { name, cpuSec, systemSec }] of after) {
    const used = cpuSec - (before.get(tid)?.cpuSec ?? 0);
    if (used <= 0) continue;
    total += used;
    const kernel = systemSec - (before.get(tid)?.systemSec ?? 0);
    rows.push([`${name} (${tid})`, (used * 1e6) / requests, (kernel * 1e6) / requests]);
  }
  rows.sort((a, b) => b[1] - a[1]);
  for (const [name, us, kernelUs] of rows) {
    console.log(`  ${name.padEnd(32)} ${us.toFixed(1)} µs/request (${kernelUs.toFixed(1)} in the kernel)`);
  }
  if (result.exhausted > 0)
    console.log(`warning: the request file ran out (${result.exhausted} /healthz sent)`);
  console.log(`  ${"all threads".padEnd(32)} ${((total * 1e6) / requests).toFixed(1)} µs/request`);
} finally {
  await server.stop("SIGTERM");
  rmSync(work, { recursive: true, force: true });
}
