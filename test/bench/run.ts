import { cpSync, rmSync } from "node:fs";
import { join } from "node:path";
import { crashTest } from "./lib/crash.ts";
import { activateDevices, BENCH_POLICY, createApiKeys, createFixture, type Fixture } from "./lib/fixture.ts";
import { FloorMeter } from "./lib/floor.ts";
import { openLoop, tailLine } from "./lib/open-model.ts";
import { sample } from "./lib/procstat.ts";
import { fixed, thousands } from "./lib/report.ts";
import {
  activationRequest,
  type BenchDevice,
  type BenchRequest,
  heartbeatRequest,
  leaseAcquireRequest,
  leaseHeartbeatRequest,
  leaseReleaseRequest,
  managementListRequest,
  pickFrom,
  timeRequest,
} from "./lib/requests.ts";
import {
  describeRun,
  type MeasureOptions,
  measure,
  measureInterleaved,
  type RouteRun,
} from "./lib/route-run.ts";
import {
  createRunContext,
  foreignLoad,
  machineLine,
  type RunContext,
  sourceCommit,
} from "./lib/run-context.ts";
import { printReport, type ScaleResult } from "./lib/run-report.ts";
import { seedActivations } from "./lib/seeding.ts";
import { type BenchServer, ensureBinary, ensureWrk, pinned, runCli, storeBytes } from "./lib/server.ts";
import {
  activeLeases,
  countActivations,
  probe,
  type StoredLease,
  sendAll,
  snapshotStore,
} from "./lib/unmeasured.ts";
import { verificationTiming } from "./verification-timing.ts";

/**
 * `npm run bench`: the performance suite of issue 7 against the compiled binary, with the floor of
 * this machine measured in the same run. See docs/performance.md for what each number means, and
 * lib/run-context.ts for the environment variables.
 *
 * The parts, in order: a fresh store with 10k activated devices; each route closed loop (wrk),
 * in slices that alternate with the floor's; the open model at half the heartbeat's maximum;
 * kill -9 under load; a million more activations (and the heartbeat again, with its floor);
 * verification timing; the report.
 */
async function main(ctx: RunContext): Promise<void> {
  const { config, log } = ctx;
  // Read before the binary is built (ensureBinary), which is what the run measures.
  const commit = sourceCommit(ctx.benchDir, process.env);
  log(`licensing bench: ${machineLine(ctx.machine)}`);
  log(
    `server pinned to CPU ${ctx.serverCpus ?? "(any)"}, load generators to CPU ${ctx.loadCpus ?? "(any)"}; work dir ${ctx.work}`,
  );
  await waitForQuiet(ctx);
  ensureWrk(log);
  log(`binary ${ensureBinary(log)}`);

  // 1. A fresh data dir, the server, 10k devices.
  const setup = await setUp(ctx);
  let server = setup.server;
  const { fixture, devices } = setup;
  // The store with its 10k devices, before any route ran, kept for the scale part: it seeds a
  // million activations into one copy of it and sets the two against each other.
  const storeBefore = join(ctx.work, "data-10k");
  if (config.scale) snapshotStore(ctx.dataDir, storeBefore);

  // 2. The floor's meter, beside the server on its core: each route's slices alternate with floor
  // slices, and a route is judged against the floor of the seconds it ran in (lib/floor.ts).
  const heartbeatBytes = await probe(server, heartbeatRequest(pickFrom(devices)), "heartbeat");
  const floor = await FloorMeter.start(ctx, heartbeatBytes, (n) =>
    Array.from({ length: n }, () => heartbeatRequest(pickFrom(devices))),
  );

  // 3. Each route, closed loop with wrk.
  const routes = await closedLoopRoutes(ctx, setup, floor, heartbeatBytes);

  // 5. Latency under load: open model at half the maximum heartbeat rate.
  const rate = Math.max(1, Math.round(routes.heartbeat.wrk.rps / 2));
  log(
    `open loop: heartbeats at ${rate}/s (half of ${fixed(routes.heartbeat.wrk.rps)}) for ${config.openLoopSec} s, after ${config.openLoopWarmUpSec} s of warm-up at that rate ...`,
  );
  const open = await openLoop(ctx, server, devices, rate);
  log(
    `  p50 ${fixed(open.latency_ms.p50, 2)} ms, p99 ${fixed(open.latency_ms.p99, 2)} ms, p99.9 ${fixed(open.latency_ms.p999, 2)} ms, max ${fixed(open.latency_ms.max, 1)} ms; ${open.completed}/${open.scheduled} completed at ${fixed(open.achieved_rps)}/s, statuses ${JSON.stringify(open.statuses)}, server CPU ${fixed(open.server_cpu_pct)}%, generator lateness p99 ${fixed(open.send_lateness_ms.p99, 2)} ms; inside the server (its own log): p99 ${fixed(open.server_logged.p99, 2)} ms, max ${fixed(open.server_logged.max, 1)} ms, ${open.server_logged.over10} requests over 10 ms; ${tailLine(open)}`,
  );

  // 6. Crash safety.
  log("crash: kill -9 during a heartbeat + activation + lease load ...");
  const crashed = await crashTest({
    server,
    restart: ctx.start,
    fixture,
    devices,
    parallel: 24,
    killAfterMs: 4000 + Math.floor(Math.random() * 1000),
    log,
  });
  server = crashed.server;
  const crash = crashed.result;
  log(
    `  restarted in ${fixed(crash.restartMs)} ms; lost ${crash.lostActivations.length} of ${crash.checked.activations} acknowledged activations and ${crash.lostLeases.length} of ${crash.checked.leases} acknowledged leases${crash.lostActivations.length + crash.lostLeases.length > 0 ? `: ${[...crash.lostActivations, ...crash.lostLeases].slice(0, 10).join(", ")}` : ""}`,
  );

  // 7. Scale: the same heartbeat with 1M more activations in the store.
  let scale: ScaleResult | undefined;
  if (config.scale) {
    ({ server, scale } = await scaleRun(ctx, server, floor, fixture, devices, routes.heartbeat, storeBefore));
    routes.runs.push(scale.heartbeatBefore, scale.heartbeat);
  }
  await server.stop("SIGTERM");
  await floor.stop();

  // 7b. Verification timing (issue 4): its own server and store; this runner is the client.
  log("verification timing: sending vs silent verification starts, interleaved ...");
  const timing = await verificationTiming({
    workDir: ctx.work,
    serverCpus: ctx.serverCpus,
    env: ctx.serverEnv,
    log,
  });

  // 8. Report.
  printReport({
    ctx,
    commit,
    floor: floor.total,
    responseBytes: routes.responseBytes,
    runs: routes.runs,
    heartbeat: routes.heartbeat,
    activation: routes.activation,
    open,
    crash,
    scale,
    timing,
    setupSec: setup.setupSec,
  });
  log(`done in ${fixed(ctx.elapsedSec())} s`);
}

/** With BENCH_WAIT_QUIET=1, waits up to 10 minutes for other processes to leave the CPU alone. */
async function waitForQuiet(ctx: RunContext): Promise<void> {
  let background = await foreignLoad();
  if (background > 20 && process.env.BENCH_WAIT_QUIET === "1") {
    const deadline = performance.now() + 10 * 60_000;
    while (background > 20 && performance.now() < deadline) {
      ctx.log(
        `other processes use ${fixed(background)}% of a core; waiting for a quieter machine (BENCH_WAIT_QUIET=1) ...`,
      );
      background = await foreignLoad(5);
    }
  }
  ctx.log(
    `other processes use ${fixed(background)}% of a core before the run${background > 20 ? ": WARNING, the figures will be understated (BENCH_WAIT_QUIET=1 waits up to 10 min for a quiet machine)" : ""}`,
  );
}

interface Setup {
  server: BenchServer;
  liveKey: string;
  fixture: Fixture;
  apiKeys: string[];
  devices: BenchDevice[];
  setupSec: number;
}

async function setUp(ctx: RunContext): Promise<Setup> {
  const { config, log } = ctx;
  const init = await runCli(["init", "--data-dir", ctx.dataDir, "--json"]);
  if (init.exitCode !== 0) throw new Error(`init failed: ${init.stderr}`);
  const liveKey = JSON.parse(init.stdout).api_keys.live as string;
  const server = await ctx.start();
  log(`server up in ${fixed(server.startupMs)} ms (pid ${server.pid}, ${server.threads()} threads)`);
  const fixture = await createFixture(server.url, liveKey, config.licenses);
  const apiKeys = await createApiKeys(ctx.dataDir, config.apiKeys);
  log(
    `product ${fixture.productId}, policy ${JSON.stringify(BENCH_POLICY)}, ${config.licenses} licenses, ${apiKeys.length} extra live API keys`,
  );
  const setupStart = performance.now();
  const devices = await activateDevices(server.url, fixture, config.devices, 16, (n) => {
    if (n % 5000 === 0) log(`  ${n} devices activated`);
  });
  const setupSec = (performance.now() - setupStart) / 1000;
  log(
    `${devices.length} devices activated over HTTP in ${fixed(setupSec, 1)} s (${fixed(devices.length / setupSec)}/s, 16 in parallel)`,
  );
  return { server, liveKey, fixture, apiKeys, devices, setupSec };
}

interface ClosedLoopRoutes {
  runs: RouteRun[];
  heartbeat: RouteRun;
  activation: RouteRun;
  responseBytes: { heartbeat: number; activation: number; list: number };
}

async function closedLoopRoutes(
  ctx: RunContext,
  setup: Setup,
  floor: FloorMeter,
  heartbeatBytes: number,
): Promise<ClosedLoopRoutes> {
  const { server, fixture, devices, apiKeys, liveKey } = setup;
  const runs: RouteRun[] = [];
  const route = async (
    name: string,
    build: (n: number) => BenchRequest[] | Promise<BenchRequest[]>,
    options: MeasureOptions,
  ) => {
    const done = await measure(ctx, name, server, floor, build, options);
    runs.push(done);
    ctx.log(describeRun(done));
    return done;
  };
  const heartbeats = (n: number) => Array.from({ length: n }, () => heartbeatRequest(pickFrom(devices)));
  // Steady state at 10k: every device has checked in before (as on a server that has been up an
  // hour), so the server has seen each key once. The 1M run below stays cold on purpose: a million
  // devices checking in once an hour each are a million different keys.
  const warmStart = performance.now();
  const warm = await sendAll(
    server.url,
    devices.map((device) => heartbeatRequest(device)),
  );
  ctx.log(
    `warm-up: one heartbeat from each of the ${devices.length} devices in ${fixed((performance.now() - warmStart) / 1000, 1)} s ${JSON.stringify(warm)}`,
  );
  const heartbeat = await route("heartbeat", heartbeats, { estimate: 2000 });

  const activations = (keys: string[]) => (n: number) =>
    Array.from({ length: n }, () => activationRequest(pickFrom(keys), fixture.productId).request);
  const activationBytes = await probe(
    server,
    activationRequest(fixture.licenseKey, fixture.productId).request,
    "activation",
  );
  const activation = await route("activation", activations([fixture.licenseKey]), { estimate: 500 });
  // The same, spread over the other 99 licenses (a few hundred devices each): what an activation
  // costs when the license does not already hold 10k devices.
  const otherKeys = fixture.licenseKeys.slice(1);
  await route(`activation, ${otherKeys.length} licenses (info)`, activations(otherKeys), {
    estimate: activation.wrk.rps * 3,
  });

  await leaseRoutes(ctx, setup, route);
  await route("time", (n) => Array.from({ length: n }, () => timeRequest(fixture.productId)), {
    estimate: 5000,
  });
  let keyIndex = 0;
  const listBytes = await probe(server, managementListRequest(liveKey), "management list");
  await route(
    "management list",
    (n) =>
      Array.from({ length: n }, () => managementListRequest(apiKeys[keyIndex++ % apiKeys.length] as string)),
    { estimate: 1000 },
  );

  // The same heartbeat with the server on every core, sharing them with wrk (information only).
  if (ctx.allCpus !== null) {
    Bun.spawnSync(["taskset", "-a", "-p", "-c", ctx.allCpus, String(server.pid)], { stdout: "ignore" });
    await route("heartbeat, unpinned (info)", heartbeats, { estimate: heartbeat.wrk.rps, cpus: ctx.allCpus });
    Bun.spawnSync(["taskset", "-a", "-p", "-c", ctx.serverCpus ?? "0", String(server.pid)], {
      stdout: "ignore",
    });
  }
  return {
    runs,
    heartbeat,
    activation,
    responseBytes: { heartbeat: heartbeatBytes, activation: activationBytes, list: listBytes },
  };
}

/** Lease acquire, heartbeat and release; each release needs a lease of its own. */
async function leaseRoutes(
  ctx: RunContext,
  setup: Setup,
  route: (
    name: string,
    build: (n: number) => BenchRequest[] | Promise<BenchRequest[]>,
    options: MeasureOptions,
  ) => Promise<RouteRun>,
): Promise<void> {
  const { server, devices } = setup;
  const byActivation = new Map(devices.map((d) => [d.activationId, d]));
  let instance = 0;
  const acquire = (n: number) =>
    Array.from({ length: n }, () => leaseAcquireRequest(pickFrom(devices), `bench-${++instance}`));
  await probe(server, acquire(1)[0] as BenchRequest, "lease acquire");
  await route("lease acquire", acquire, { estimate: 1000 });
  const leaseRequest = (kind: "heartbeat" | "release", lease: StoredLease) => {
    const device = byActivation.get(lease.activationId);
    if (!device) throw new Error(`lease ${lease.id} belongs to an unknown activation`);
    return kind === "heartbeat"
      ? leaseHeartbeatRequest(device, lease.id, lease.instanceId)
      : leaseReleaseRequest(device, lease.id, lease.instanceId);
  };
  const leases = activeLeases(ctx.dataDir);
  const leaseHeartbeat = await route(
    "lease heartbeat",
    (n) => Array.from({ length: n }, () => leaseRequest("heartbeat", pickFrom(leases))),
    { estimate: 2000 },
  );
  // Acquire more (unmeasured) when the pool is short.
  const released = new Set<string>();
  const releaseBatch = async (n: number) => {
    let pool = activeLeases(ctx.dataDir).filter((l) => !released.has(l.id));
    if (pool.length < n) {
      const missing = n - pool.length + 1000;
      ctx.log(`  acquiring ${missing} more leases for the release run ...`);
      await sendAll(server.url, acquire(missing));
      pool = activeLeases(ctx.dataDir).filter((l) => !released.has(l.id));
    }
    const chosen = pool.slice(0, n);
    for (const lease of chosen) released.add(lease.id);
    return chosen.map((lease) => leaseRequest("release", lease));
  };
  // Released leases are gone for good, so no calibration run: a release costs about what a lease heartbeat does.
  await route("lease release", releaseBatch, { estimate: leaseHeartbeat.wrk.rps, calibrate: false });
}

/**
 * Stops the server, seeds a million activations into a copy of the store taken before the routes
 * ran (10k devices), and starts a server on that copy and one on the store as taken: the heartbeat
 * over each is measured in alternating slices, so the two are compared over the same seconds of
 * the machine (its speed moves within a second).
 */
async function scaleRun(
  ctx: RunContext,
  stopping: BenchServer,
  floor: FloorMeter,
  fixture: Fixture,
  devices: BenchDevice[],
  heartbeat: RouteRun,
  smallDir: string,
): Promise<{ server: BenchServer; scale: ScaleResult }> {
  const { config, log } = ctx;
  const stopCode = await stopping.stop("SIGTERM");
  if (stopCode !== 0) log(`  warning: the server exited ${stopCode} on SIGTERM`);
  // Both sides start from the same store, with the same history: the 1M side is a copy of it
  // with the activations seeded in (the live store has every route's nonces and leases besides).
  const dataDir = join(ctx.work, "data-1m");
  cpSync(smallDir, dataDir, { recursive: true });
  const rowsBefore = countActivations(smallDir);
  const bytesBefore = storeBytes(dataDir);
  log(
    `scale: seeding ${thousands(config.scaleRows)} activations into a copy of the store as it was before the routes (${thousands(rowsBefore)} there) ...`,
  );
  const seedStart = performance.now();
  const { stats: seed, devices: seededDevices } = seedActivations({
    store: join(dataDir, "licensing.db"),
    productId: fixture.productId,
    rows: config.scaleRows,
    sample: config.scaleSample,
    sampleFile: join(ctx.work, "seeded-sample.txt"),
    command: (args) => pinned(ctx.allCpus, args),
  });
  const seedSec = (performance.now() - seedStart) / 1000;
  const bytesAfter = storeBytes(dataDir);
  const rowsAfter = countActivations(dataDir);
  log(
    `  seeded ${thousands(seed.rows ?? 0)} rows in ${fixed(seedSec, 1)} s (inserts ${fixed(seed.insert_seconds ?? 0, 1)} s, waiting for keys ${fixed(seed.waiting_for_keys_seconds ?? 0, 1)} s); store ${fixed(bytesAfter / 2 ** 20)} MiB, ${fixed((bytesAfter - bytesBefore) / (seed.rows ?? 1))} bytes per activation`,
  );
  const server = await ctx.start(dataDir);
  await Bun.sleep(500);
  const idle = sample(server.pid);
  log(
    `  start-up with ${thousands(rowsAfter)} activations: ${fixed(server.startupMs)} ms, idle RSS ${fixed(idle.rssMiB)} MiB`,
  );
  const small = await ctx.start(smallDir);
  await probe(server, heartbeatRequest(pickFrom(seededDevices)), "heartbeat at scale");
  await probe(small, heartbeatRequest(pickFrom(devices)), "heartbeat before scale");
  // Both servers are fresh: neither has seen a device's key yet, nor compiled the route.
  const [before, big] = (await measureInterleaved(ctx, floor, [
    {
      name: `heartbeat, ${thousands(rowsBefore)} activations (beside the 1M run)`,
      target: small,
      build: (n) => Array.from({ length: n }, () => heartbeatRequest(pickFrom(devices))),
      options: { estimate: heartbeat.wrk.rps },
    },
    {
      name: `heartbeat, ${thousands(rowsAfter)} activations`,
      target: server,
      build: (n) => Array.from({ length: n }, () => heartbeatRequest(pickFrom(seededDevices))),
      options: { estimate: heartbeat.wrk.rps },
    },
  ])) as [RouteRun, RouteRun];
  await small.stop("SIGTERM");
  log(describeRun(before));
  log(describeRun(big));
  return {
    server,
    scale: {
      rowsBefore,
      rowsAfter,
      seedSec,
      seed,
      bytesPerActivation: (bytesAfter - bytesBefore) / (seed.rows ?? 1),
      storeMiB: bytesAfter / 2 ** 20,
      startupMs: server.startupMs,
      idleRssMiB: idle.rssMiB,
      heartbeatBefore: before,
      heartbeat: big,
    },
  };
}

const ctx = createRunContext(process.env);
if (ctx.loadCpus !== null)
  Bun.spawnSync(["taskset", "-a", "-p", "-c", ctx.loadCpus, String(process.pid)], { stdout: "ignore" });
try {
  await main(ctx);
} finally {
  for (const server of ctx.started)
    if (server.proc.exitCode === null && server.proc.signalCode === null) server.proc.kill("SIGKILL");
  for (const child of ctx.children)
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  if (ctx.config.keep) console.log(`kept ${ctx.work}`);
  else rmSync(ctx.work, { recursive: true, force: true });
}
