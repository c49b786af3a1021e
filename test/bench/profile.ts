import { mkdirSync, mkdtempSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { freePort } from "../e2e/binary.ts";
import { activateDevices, createFixture } from "./lib/fixture.ts";
import {
  activationRequest,
  type BenchDevice,
  type BenchRequest,
  heartbeatRequest,
  leaseAcquireRequest,
  pickFrom,
  timeRequest,
  writeRequestFile,
} from "./lib/requests.ts";
import { seedActivations } from "./lib/seeding.ts";
import { ensureWrk, initToolStore, startServer, toolServerEnv } from "./lib/server.ts";
import { runWrk } from "./lib/wrk.ts";

/**
 * Where a route spends its time: runs the server from the sources under Bun's sampling profiler
 * (--cpu-prof-md, readable markdown with file:line), pinned to core 0, drives one route with wrk
 * from core 1, stops the server and prints where the profile is.
 *
 * Usage: bun test/bench/profile.ts [heartbeat|activation|lease-acquire|time] [SECONDS]
 * PROFILE_ROOT=<dir> profiles another checkout's sources (default: this repository);
 * PROFILE_DEVICES (500) devices are activated first (their cost is in the profile too), on the
 * first of PROFILE_LICENSES (1) licenses; profiled activations go to a random one of them.
 * PROFILE_SCALE_ROWS=1000000 (heartbeat only): the server is stopped after that, the rows are
 * seeded into its store (seed.ts, as the bench's scale run does), and the heartbeats come from
 * seeded devices of a server restarted cold: the second profile printed is of that run.
 * PROFILE_CONNECTIONS (32) requests in flight; 1 profiles requests served alone, as in the
 * open-model run.
 */
const routeName = process.argv[2] ?? "heartbeat";
const seconds = Number(process.argv[3] ?? 10);
const deviceCount = Number(process.env.PROFILE_DEVICES ?? 500);
const licenseCount = Number(process.env.PROFILE_LICENSES ?? 1);
const root = resolve(process.env.PROFILE_ROOT ?? join(import.meta.dir, "..", ".."));
const scaleRows = Number(process.env.PROFILE_SCALE_ROWS ?? 0);
if (scaleRows > 0 && routeName !== "heartbeat")
  throw new Error("PROFILE_SCALE_ROWS profiles heartbeats only");
ensureWrk((line) => console.log(line));
const work = mkdtempSync(join(tmpdir(), "licensing-profile-"));
const dataDir = join(work, "data");
const profileDir = join(work, "profile");
mkdirSync(profileDir);
const liveKey = await initToolStore(dataDir);
const port = await freePort();
const startProfiled = () =>
  startServer({
    dataDir,
    port,
    cpus: "0",
    logDir: work,
    env: toolServerEnv(),
    command: [
      process.execPath,
      // PROFILE_JSON=1: Chrome's .cpuprofile instead (for tools that want the raw samples).
      process.env.PROFILE_JSON === "1" ? "--cpu-prof" : "--cpu-prof-md",
      "--cpu-prof-interval=250",
      `--cpu-prof-dir=${profileDir}`,
      join(root, "src/main.ts"),
    ],
  });
let server = await startProfiled();
try {
  const fixture = await createFixture(server.url, liveKey, licenseCount);
  let devices: BenchDevice[] = await activateDevices(server.url, fixture, deviceCount, 16);
  if (scaleRows > 0) {
    await server.stop("SIGTERM");
    devices = seedRows(fixture.productId, scaleRows);
    server = await startProfiled();
  }
  const pick = () => pickFrom(devices);
  let instance = 0;
  const builders: Record<string, () => BenchRequest> = {
    heartbeat: () => heartbeatRequest(pick()),
    activation: () => activationRequest(pickFrom(fixture.licenseKeys), fixture.productId).request,
    "lease-acquire": () => leaseAcquireRequest(pick(), `profile-${++instance}`),
    time: () => timeRequest(fixture.productId),
  };
  const build = builders[routeName];
  if (!build) throw new Error(`unknown route ${routeName}`);
  const file = join(work, "requests.txt");
  // Enough for 6,000/s (twice the fastest route under the profiler): a file that runs out would
  // leave wrk sending /healthz for the rest of the run, and the profile would be of that.
  writeRequestFile(
    file,
    Array.from({ length: seconds * (routeName === "time" ? 15000 : 6000) }, () => build()),
  );
  const result = await runWrk({
    url: server.url,
    file,
    durationSec: seconds,
    connections: Number(process.env.PROFILE_CONNECTIONS ?? 32),
    cpus: "1",
  });
  console.log(`${routeName}: ${result.rps.toFixed(0)} req/s, statuses ${JSON.stringify(result.statuses)}`);
  if (result.exhausted > 0) {
    console.log(
      `warning: the request file ran out (${result.exhausted} /healthz sent instead); the profile is not of ${routeName} alone`,
    );
  }
} finally {
  await server.stop("SIGTERM");
}
console.log(
  `profile: ${readdirSync(profileDir)
    .map((f) => join(profileDir, f))
    .join(", ")}`,
);

/** The bench's scale seeding (seed.ts) into the stopped store; the sampled rows' devices. */
function seedRows(productId: string, rows: number): BenchDevice[] {
  const { stats, devices } = seedActivations({
    store: join(dataDir, "licensing.db"),
    productId,
    rows,
    sample: Math.min(rows, 100_000),
    sampleFile: join(work, "seeded-sample.txt"),
  });
  console.log(`seeded: ${JSON.stringify(stats)}`);
  return devices;
}
