import { writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { CrashResult } from "./crash.ts";
import { type FloorOps, type FloorTally, floorOf } from "./floor.ts";
import { type OpenLoopResult, tailLine } from "./open-model.ts";
import { fixed, percent, table, thousands } from "./report.ts";
import type { RouteRun } from "./route-run.ts";
import { machineLine, type RunContext } from "./run-context.ts";
import { binaryPath } from "./server.ts";

/** Everything `npm run bench` measured, for the report and its JSON file. */
export interface RunResults {
  ctx: RunContext;
  commit: string | null;
  /** Every floor slice of the run (each route's own are in its RouteRun). */
  floor: FloorTally;
  responseBytes: { heartbeat: number; activation: number; list: number };
  runs: RouteRun[];
  heartbeat: RouteRun;
  activation: RouteRun;
  open: OpenLoopResult;
  crash: CrashResult;
  scale?: ScaleResult;
  timing: { routes: unknown[]; report: string; acceptance: AcceptanceRow[] };
  setupSec: number;
}

export interface ScaleResult {
  rowsBefore: number;
  rowsAfter: number;
  seedSec: number;
  seed: Record<string, number>;
  bytesPerActivation: number;
  storeMiB: number;
  startupMs: number;
  idleRssMiB: number;
  /** The heartbeat over the store as it was before the seeding, in slices alternating with `heartbeat`. */
  heartbeatBefore: RouteRun;
  /** The heartbeat over the seeded store. */
  heartbeat: RouteRun;
}

/** target, measured, value, by CPU time, result */
export type AcceptanceRow = [string, string, string, string, string];

type Floors = Record<string, { formula: string; us: number }>;

const us = (n: number) => `${fixed(n, 1)}`;

/** Each route's floor: the sum of what it cannot avoid, µs per request on one core. */
function routeFloors(ops: FloorOps, httpUs: number): Floors {
  return {
    heartbeat: {
      formula: "http + verify + read + write + 2 sign",
      us: httpUs + ops.verify_us + ops.read_us + ops.write_us + 2 * ops.sign_us,
    },
    // The activation's floor counts the writes the spec requires of it (its row under the unique
    // (license, device) binding, the Idempotency-Key record the spec makes mandatory, its nonce):
    // issue 7 defines the floor as "the store reads and writes" of the unavoidable work, and
    // DESIGN §7 budgets only the heartbeat's (one write). The one-UPDATE figure is printed beside.
    activation: {
      formula: "http + verify + read + activation writes + 2 sign",
      us: httpUs + ops.verify_us + ops.read_us + ops.activation_write_us + 2 * ops.sign_us,
    },
    "lease acquire": {
      formula: "http + verify + read + write + sign",
      us: httpUs + ops.verify_us + ops.read_us + ops.write_us + ops.sign_us,
    },
    "lease heartbeat": {
      formula: "http + verify + read + write + sign",
      us: httpUs + ops.verify_us + ops.read_us + ops.write_us + ops.sign_us,
    },
    "lease release": {
      formula: "http + verify + read + write + sign",
      us: httpUs + ops.verify_us + ops.read_us + ops.write_us + ops.sign_us,
    },
    time: { formula: "http + sign", us: httpUs + ops.sign_us },
    "management list": { formula: "http + read + page of 50", us: httpUs + ops.read_us + ops.page50_us },
  };
}

/** The floors of the seconds a route ran in (measured in the slices between its own). */
const floorsOf = (run: RouteRun): Floors => routeFloors(run.floor, run.httpUs);

/** Which floor a run is judged against: heartbeats (any store size) and activations share theirs. */
const floorKey = (run: RouteRun) =>
  run.name.startsWith("heartbeat")
    ? "heartbeat"
    : run.name.startsWith("activation")
      ? "activation"
      : run.name;

/** Route req/s ÷ the req/s of its own floor. */
const ofFloor = (run: RouteRun) => run.wrk.rps * ((floorsOf(run)[floorKey(run)]?.us ?? Number.NaN) / 1e6);

/** Prints the report and writes every figure as JSON to the temp dir. */
export function printReport(r: RunResults): void {
  const overall = floorOf(r.floor);
  const floors = routeFloors(overall.ops, overall.httpUs);
  printFloorAndRoutes(r, floors, overall);
  printOpenModel(r.open);
  printCrash(r.crash);
  if (r.scale) printScale(r, r.scale);
  const acceptance = acceptanceRows(r);
  console.log(`\n${r.timing.report}`);
  acceptance.push(...r.timing.acceptance);
  console.log("\n## Summary\n");
  console.log(
    table(["target", "measured", "value", "by CPU time", "result"], acceptance, ["l", "r", "r", "r", "l"]),
  );
  console.log(
    "\nresult is judged on the measured value; by CPU time gives the same ratio from the server's CPU µs per request (floor µs ÷ server µs; for scale, the 10k run's µs ÷ the 1M run's); a route with any non-2xx answer or socket error fails its target, which other processes on the machine do not distort.",
  );
  const results = {
    machine: r.ctx.machine,
    config: r.ctx.config,
    floorOverall: overall,
    floors,
    floorsForInformation: informationFloors(r).map(({ name, formula, us }) => ({ name, formula, us })),
    runs: r.runs.map((run) => ({
      ...run,
      floors: floorsOf(run),
      wrk: { ...run.wrk, quantilesUs: undefined },
    })),
    open: r.open,
    crash: r.crash,
    scale: r.scale,
    acceptance,
    setupSec: r.setupSec,
    timing: r.timing.routes,
  };
  const resultsFile = join(
    tmpdir(),
    `licensing-bench-${new Date().toISOString().replace(/[:.]/g, "-")}.json`,
  );
  writeFileSync(resultsFile, JSON.stringify(results, null, 2));
  console.log(`\nAll figures as JSON: ${resultsFile}`);
}

/**
 * Information beside the targets: the heartbeat against a floor that counts both its writes (its
 * nonce and its check-in, where DESIGN §7's budget counts one write), and the activation against
 * the one-UPDATE floor its target used until the thirteenth performance session.
 */
function informationFloors(r: RunResults) {
  const { heartbeat, activation } = r;
  const [hb, act] = [heartbeat.floor, activation.floor];
  return [
    {
      name: "heartbeat",
      run: heartbeat,
      formula: "http + verify + read + heartbeat writes + 2 sign",
      us: heartbeat.httpUs + hb.verify_us + hb.read_us + hb.heartbeat_write_us + 2 * hb.sign_us,
    },
    {
      name: "activation",
      run: activation,
      formula: "http + verify + read + write + 2 sign",
      us: activation.httpUs + act.verify_us + act.read_us + act.write_us + 2 * act.sign_us,
    },
  ];
}

function printFloorAndRoutes(
  r: RunResults,
  floors: Floors,
  overall: { ops: FloorOps; httpUs: number },
): void {
  const { ctx, runs, commit } = r;
  const { ops, httpUs } = overall;
  const { config } = ctx;
  console.log("");
  console.log(
    `## Machine\n\n${machineLine(ctx.machine)}; binary ${binaryPath()}${commit ? ` (source at ${commit})` : ""}`,
  );
  console.log(
    `Server pinned to CPU ${ctx.serverCpus}, load generators to CPU ${ctx.loadCpus}; ${config.connections} connections, ${config.durationSec} s per route (in 2 s slices, each followed by 2 s of floor) after a ${config.calibrateSec} s calibration run.\n`,
  );
  console.log("## Floor (one core, over every floor slice of the run)\n");
  console.log(
    table(
      ["operation", "µs", "source"],
      [
        [
          "http (HTTP + JSON)",
          us(httpUs),
          `minimal Bun.serve answering ${r.responseBytes.heartbeat} B of JSON: server CPU time per request (wrk: ${thousands(r.floor.httpRequests / r.floor.httpWallSec)} req/s at ${fixed((r.floor.httpCpuSec / r.floor.httpWallSec) * 100)}% CPU)`,
        ],
        ["verify (Ed25519)", us(ops.verify_us), "node:crypto, key imported once"],
        ["sign (Ed25519)", us(ops.sign_us), "node:crypto, key imported once"],
        ["read (indexed)", us(ops.read_us), "bun:sqlite prepared SELECT by primary key, 100k rows"],
        [
          "write",
          us(ops.write_us),
          "bun:sqlite prepared UPDATE by primary key, own transaction, WAL, synchronous=NORMAL",
        ],
        ["append (info)", us(ops.append_us), "prepared INSERT, own transaction"],
        ["page of 50", us(ops.page50_us), "prepared range SELECT, 50 rows"],
        [
          "activation writes",
          us(ops.activation_write_us),
          "its row, its Idempotency-Key record (1.6 KB answer) and its nonce, each under its unique index, one transaction",
        ],
        [
          "heartbeat writes (info)",
          us(ops.heartbeat_write_us),
          "nonce INSERT + check-in UPDATE, one transaction",
        ],
      ],
      ["l", "r", "l"],
    ),
  );
  console.log("\n## Routes (closed loop, wrk)\n");
  const routeRows = runs.map((run) => {
    const floor = floorsOf(run)[floorKey(run)];
    const floorRps = floor ? 1e6 / floor.us : Number.NaN;
    return [
      run.name,
      thousands(run.wrk.rps),
      fixed(run.wrk.latencyMs.p50, 2),
      fixed(run.wrk.latencyMs.p99, 2),
      fixed(run.wrk.latencyMs.p999, 2),
      String(run.wrk.non2xx + run.wrk.socketErrors),
      fixed(run.cpuPct),
      fixed(run.cpuUsPerRequest),
      `${fixed(run.rssBeforeMiB)}→${fixed(run.rssAfterMiB)}`,
      floor ? fixed(floor.us, 1) : "",
      floor ? thousands(floorRps) : "",
      floor ? percent(run.wrk.rps / floorRps) : "",
      floor ? percent(floor.us / run.cpuUsPerRequest) : "",
      fixed(run.otherPct),
    ];
  });
  console.log(
    table(
      [
        "route",
        "req/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "non-2xx",
        "CPU %",
        "CPU µs/req",
        "RSS MiB",
        "floor µs",
        "floor req/s",
        "of floor",
        "of floor (CPU)",
        "other CPU %",
      ],
      routeRows,
    ),
  );
  console.log(
    "\nreq/s, latency and non-2xx (statuses other than 2xx, plus socket errors) from wrk; CPU % and RSS (before→after) of the server from /proc; floor = the route's floor (formulas below) measured in the floor slices between its own, the seconds it ran in; of floor = req/s ÷ floor req/s; of floor (CPU) = floor µs ÷ the server's CPU µs per request, which other load on the machine cannot distort; other CPU % = CPU used during the run by processes that are neither the server, wrk nor this runner.",
  );
  const noisy = runs.filter((run) => run.otherPct > 15);
  if (noisy.length > 0) {
    console.log(
      `WARNING: other processes used ${noisy.map((run) => `${fixed(run.otherPct)}% during "${run.name}"`).join(", ")} of a core: throughput and latency are understated; the CPU-based ratios are not affected.`,
    );
  }
  console.log(
    "\nFloor formulas (µs per request on one core; here with the floor of every slice of the run):",
  );
  for (const [name, floor] of Object.entries(floors))
    console.log(
      `  ${name.padEnd(16)} = ${floor.formula} = ${us(floor.us)} µs → ${thousands(1e6 / floor.us)} req/s`,
    );
  console.log("\nFor information (no target uses these):");
  for (const floor of informationFloors(r))
    console.log(
      `  ${floor.name.padEnd(16)} = ${floor.formula} = ${us(floor.us)} µs → ${thousands(1e6 / floor.us)} req/s; measured ${thousands(floor.run.wrk.rps)} req/s = ${percent(floor.run.wrk.rps / (1e6 / floor.us))} of it (${percent(floor.us / floor.run.cpuUsPerRequest)} by CPU time)`,
    );
  // How far the machine's speed moved during the run: the same formula on each route's slices.
  const heartbeatFloors = runs.map((run) => ({
    name: run.name,
    us: floorsOf(run).heartbeat?.us ?? Number.NaN,
  }));
  const slowest = heartbeatFloors.reduce((a, b) => (b.us > a.us ? b : a));
  const fastest = heartbeatFloors.reduce((a, b) => (b.us < a.us ? b : a));
  console.log(
    `\nFloor spread: the heartbeat's floor formula gives ${us(fastest.us)} µs in the slices of "${fastest.name}" and ${us(slowest.us)} µs in those of "${slowest.name}" (${fixed((slowest.us / fastest.us - 1) * 100)}% apart): the machine's speed moved that much between routes, which is why each route is judged against its own slices' floor.`,
  );
  console.log(
    `\nResponse sizes: heartbeat ${r.responseBytes.heartbeat} B, activation ${r.responseBytes.activation} B, management list ${r.responseBytes.list} B.`,
  );
}

function printOpenModel(open: OpenLoopResult): void {
  console.log("\n## Latency under load (open model, heartbeat)\n");
  console.log(
    table(
      [
        "rate req/s",
        "achieved",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "non-2xx",
        "server CPU %",
        "generator lateness p99 ms",
        "in-server p99 / max ms",
      ],
      [
        [
          String(open.rate),
          fixed(open.achieved_rps),
          fixed(open.latency_ms.p50, 2),
          fixed(open.latency_ms.p90, 2),
          fixed(open.latency_ms.p99, 2),
          fixed(open.latency_ms.p999, 2),
          fixed(open.latency_ms.max, 1),
          String(open.scheduled - (open.statuses["200"] ?? 0)),
          fixed(open.server_cpu_pct),
          fixed(open.send_lateness_ms.p99, 2),
          `${fixed(open.server_logged.p99, 2)} / ${fixed(open.server_logged.max, 1)}`,
        ],
      ],
    ),
  );
  console.log(
    "\nLatency is measured from each request's scheduled send time to the end of its response (open model: queueing counts). in-server = the duration the server logs for the same requests (handler time only); a gap between the two is queueing in the server's event loop, the kernel or the generator.",
  );
  console.log(
    `\nOf the ${open.server_logged.over10} requests over 10 ms inside the server, ${tailLine(open)}. A request counts for an event when it completed between 30 ms before and 120 ms after it (a request may count for both); "by chance" is the same count with every event moved by 500 ms (when steal is frequent, the moved windows catch it too). Steal is time the hypervisor gave the server's virtual CPU to something else.`,
  );
}

function printCrash(crash: CrashResult): void {
  console.log("\n## Crash safety\n");
  console.log(
    `kill -9 after ${fixed(crash.loadSec, 1)} s of load (${crash.sent} requests sent, ${crash.inFlightAtKill} in flight at the kill); acknowledged before the kill: ${crash.acknowledged.activations} activations, ${crash.acknowledged.leases} leases, ${crash.acknowledged.heartbeats} heartbeats. Restart ${fixed(crash.restartMs)} ms. Missing after restart: ${crash.lostActivations.length} activations, ${crash.lostLeases.length} leases.`,
  );
}

function printScale(r: RunResults, scale: ScaleResult): void {
  const { ctx, heartbeat } = r;
  const row = (label: string, run: RouteRun) => [
    label,
    thousands(run.wrk.rps),
    fixed(run.wrk.latencyMs.p99, 2),
    fixed(run.cpuUsPerRequest),
    percent(ofFloor(run)),
    fixed(run.rssAfterMiB),
  ];
  console.log("\n## Scale\n");
  console.log(
    table(
      ["activations in store", "heartbeat req/s", "p99 ms", "CPU µs/req", "of floor", "RSS MiB"],
      [
        row(`${thousands(ctx.config.devices)} (the heartbeat route above)`, heartbeat),
        row(`${thousands(scale.rowsBefore)} (restarted, beside the 1M run)`, scale.heartbeatBefore),
        row(thousands(scale.rowsAfter), scale.heartbeat),
      ],
      ["l", "r", "r", "r", "r", "r"],
    ),
  );
  console.log(
    `\nThe last two ran in alternating 2 s slices on two fresh servers, one over a copy of the store taken before the seeding and one over the seeded store: the target compares them. Seeding ${thousands(scale.seed.rows ?? 0)} activations (real Ed25519 + P-256 keys, ${scale.seed.workers} key workers, 10k-row transactions): ${fixed(scale.seedSec, 1)} s. Store ${fixed(scale.storeMiB)} MiB, ${fixed(scale.bytesPerActivation)} bytes per activation (table + indexes). Start-up with ${thousands(scale.rowsAfter)} activations: ${fixed(scale.startupMs)} ms to /readyz, idle RSS ${fixed(scale.idleRssMiB)} MiB.`,
  );
}

/** The verdict rows of the targets this file judges (the timing routes bring their own). */
export function acceptanceRows(
  r: Pick<RunResults, "heartbeat" | "activation" | "open" | "crash" | "scale">,
): AcceptanceRow[] {
  const { heartbeat, activation, open, crash, scale } = r;
  const floorUs = (run: RouteRun) => floorsOf(run)[floorKey(run)]?.us ?? Number.NaN;
  const heartbeatRatio = ofFloor(heartbeat);
  const activationRatio = ofFloor(activation);
  // The 1M heartbeat and the one over the store before seeding ran in alternating slices, over
  // the same seconds of the machine: their req/s compare directly.
  const scaleRatio = scale ? scale.heartbeat.wrk.rps / scale.heartbeatBefore.wrk.rps : Number.NaN;
  const lost = crash.lostActivations.length + crash.lostLeases.length;
  const verdict = (ok: boolean) => (ok ? "PASS" : "FAIL");
  // A ratio counts only answers that did the route's work: an error answer is cheaper.
  const clean = (...runs: RouteRun[]) => runs.every((run) => run.wrk.non2xx + run.wrk.socketErrors === 0);
  // The same ratios from the server's CPU time per request, which other load cannot distort.
  const cpuRatio = (run: RouteRun) => floorUs(run) / run.cpuUsPerRequest;
  return [
    [
      "heartbeat throughput ≥ 60% of floor",
      `${thousands(heartbeat.wrk.rps)} / ${thousands(1e6 / floorUs(heartbeat))} req/s`,
      percent(heartbeatRatio),
      percent(cpuRatio(heartbeat)),
      verdict(heartbeatRatio >= 0.6 && clean(heartbeat)),
    ],
    [
      "activation throughput ≥ 50% of floor (with its writes)",
      `${thousands(activation.wrk.rps)} / ${thousands(1e6 / floorUs(activation))} req/s`,
      percent(activationRatio),
      percent(cpuRatio(activation)),
      verdict(activationRatio >= 0.5 && clean(activation)),
    ],
    [
      "heartbeat p99 < 10 ms at half max (open model)",
      `${open.rate} req/s`,
      `${fixed(open.latency_ms.p99, 2)} ms`,
      "-",
      verdict(open.latency_ms.p99 < 10 && open.failed === 0),
    ],
    [
      "heartbeat 1M / 10k ≥ 80% (alternating slices)",
      scale
        ? `${thousands(scale.heartbeat.wrk.rps)} / ${thousands(scale.heartbeatBefore.wrk.rps)} req/s (of floor ${percent(ofFloor(scale.heartbeat))} / ${percent(ofFloor(scale.heartbeatBefore))})`
        : "BENCH_SCALE=0",
      scale ? percent(scaleRatio) : "-",
      scale ? percent(scale.heartbeatBefore.cpuUsPerRequest / scale.heartbeat.cpuUsPerRequest) : "-",
      scale ? verdict(scaleRatio >= 0.8 && clean(scale.heartbeat, scale.heartbeatBefore)) : "SKIPPED",
    ],
    [
      "no acknowledged write lost on kill -9",
      `${crash.checked.activations} activations, ${crash.checked.leases} leases`,
      `${lost} lost`,
      "-",
      verdict(lost === 0 && crash.checked.activations > 0),
    ],
  ];
}
