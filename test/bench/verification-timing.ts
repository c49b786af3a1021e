import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "../e2e/binary.ts";
import { createApiKeys } from "./lib/fixture.ts";
import { machineInfo } from "./lib/procstat.ts";
import { nonce } from "./lib/requests.ts";
import { ensureBinary, mgmt, runCli, startServer } from "./lib/server.ts";
import { type ClassSpec, describeTiming, type RouteTiming } from "./lib/timing-analysis.ts";
import {
  type Context,
  deviceKey,
  eachWithKeys,
  freshAddress,
  type Planned,
  post,
  ROUND,
  runPlan,
  schedule,
  warmThenMeasure,
} from "./lib/timing-harness.ts";

/**
 * Issue 4's timing acceptance: the 202 of a verification start that sends a code and of one that
 * is refused silently must not be told apart by latency. For each of the two routes, requests of
 * a sending class and of silent classes go one at a time, in random order, over keep-alive HTTP on
 * 127.0.0.1 to the compiled binary (server on one core, this client on the other); the latencies
 * are compared with the difference of medians (bootstrap 95% CI) and a two-sample KS test, and
 * the outbox is counted afterwards to prove each class did (or did not) send. See
 * docs/performance.md "Verification timing".
 *
 * `bun test/bench/verification-timing.ts` runs it alone; run.ts calls `verificationTiming`.
 * BENCH_TIMING_REQUESTS (2000 per class), BENCH_TIMING_GAP_MS (2), BENCH_KEEP=1.
 */

/** Every request comes from 127.0.0.1: the per-address runtime window would refuse most of them. */
export const TIMING_SERVER_ENV = {
  LICENSING_RUNTIME_RATE_LIMIT_IP: "off",
  LICENSING_RUNTIME_RATE_LIMIT_ACTIVATION: "off",
  LICENSING_RUNTIME_RATE_LIMIT_LICENSE: "off",
};
/** How long a counted start holds back the next one of its subject (product, key, address), and a second more. */
const GAP_MS = 121_000;

/** Sends every body once, as many at a time as there are keys (runtime calls need none), unmeasured. */
const primeAll = (ctx: Context, path: string, bodies: string[]) =>
  eachWithKeys(ctx.keys, bodies, async (body) => {
    const result = await post(ctx, path, body);
    if (result.status !== 202) throw new Error(`a priming start answered ${result.status}`);
  });

/**
 * Named users: an assigned user (sends), an assigned user inside the 120 s send gap (held back
 * by the send limits), an unknown address, a user not assigned. Every measured start has an
 * address of its own that met the store exactly once before (one earlier start: the open
 * verification its start replaces or, held back, rewrites): the limits read a subject's and an
 * address's verifications of the last 24 hours, so an address reused across the run would cost
 * more than a fresh one whatever its class. An attacker compares two addresses that share a
 * history (their own probes), not one that has and one that has not.
 *
 * Since the limits count every start they let through, with or without a user, the sending,
 * unknown and unassigned classes' earlier starts must be more than 120 s old, or theirs would be
 * held back too: they are all made first (none mails: the sending class's addresses get their
 * user afterwards), and the run waits out the gap, which the trials' run fills (the returned
 * function measures). The gap class's earlier start mails its code right before its round.
 */
async function prepareEmailVerification(ctx: Context): Promise<() => Promise<RouteTiming>> {
  const { url } = ctx.server;
  const product = await mgmt(url, ctx.key, "POST", "/mgmt/v1/products", {
    name: "Timing named users",
    code: `timing-nu-${Date.now().toString(36)}`,
    environment: "live",
  });
  const productId = product.body.data.public_id as string;
  const policy = await mgmt(url, ctx.key, "POST", "/mgmt/v1/policies", {
    product_id: productId,
    name: "Named",
    identity_mode: "named_user",
    license_unit_limit: null,
  });
  const license = await mgmt(url, ctx.key, "POST", "/mgmt/v1/licenses", {
    product_id: productId,
    policy_id: policy.body.data.public_id,
  });
  const licenseId = license.body.data.public_id as string;
  const licenseKey = license.body.data.key as string;
  const user = async (key: string, email: string, assigned: boolean) => {
    const created = await mgmt(url, key, "POST", "/mgmt/v1/license-users", { email, name: "timing" });
    if (assigned)
      await mgmt(url, key, "POST", `/mgmt/v1/licenses/${licenseId}/assignments`, {
        user_id: created.body.data.public_id,
      });
  };
  const classes: ClassSpec[] = [
    { name: "assigned user (sends)", sends: true },
    { name: "assigned user inside its 120 s send gap", sends: false },
    { name: "unknown address", sends: false },
    { name: "user not assigned", sends: false },
  ];
  const labels = ["assigned", "gap", "unknown", "unassigned"];
  const body = (email: string) =>
    JSON.stringify({
      product_id: productId,
      license_key: licenseKey,
      email,
      device_signing_public_key: deviceKey(),
      nonce: nonce(),
      locale: "en",
      sdk_version: "bench",
    });
  const path = "/runtime/v1/email-verifications";
  const plan = (cls: number): Planned => {
    const email = freshAddress(labels[cls] as string);
    return { cls, email, body: body(email) };
  };
  const warm = schedule(classes.length, 100).map(plan);
  const measured = schedule(classes.length, ctx.perClass).map(plan);
  const aged = [...warm, ...measured].filter((item) => item.cls !== 1);
  const of = (items: Planned[], cls: number) =>
    items.filter((item) => item.cls === cls).map((item) => item.email);
  ctx.log(`  email verification: priming ${aged.length} addresses ...`);
  await eachWithKeys(ctx.keys, of(aged, 3), (email, key) => user(key, email, false));
  await primeAll(
    ctx,
    path,
    aged.map((item) => body(item.email)),
  );
  const primedAt = performance.now();
  await eachWithKeys(ctx.keys, of(aged, 0), (email, key) => user(key, email, true));

  /** Every ROUND requests, unmeasured: the gap class's users, each sent its code. */
  const primeRounds = (items: Planned[]) => async (index: number) => {
    if (index % ROUND !== 0) return;
    const gap = of(items.slice(index, index + ROUND), 1);
    await eachWithKeys(ctx.keys, gap, (email, key) => user(key, email, true));
    await runPlan(
      ctx,
      path,
      classes,
      gap.map((email) => ({ cls: 0, email, body: body(email) })),
      false,
    );
    // The primes' mails are written 50-500 ms after their answers: before the round, not in it.
    await Bun.sleep(700);
  };
  return async () => {
    const wait = primedAt + GAP_MS - performance.now();
    if (wait > 0) {
      ctx.log(
        `  email verification: waiting ${(wait / 1000).toFixed(0)} s for the primes to leave the gap ...`,
      );
      await Bun.sleep(wait);
    }
    return warmThenMeasure(ctx, { label: "email verification", path, classes, warm, measured, primeRounds });
  };
}

/** Trials: a fresh address (sends), an address inside its 120 s gap, a product without a trial policy. */
async function trialVerification(ctx: Context): Promise<RouteTiming> {
  const { url } = ctx.server;
  const product = async (label: string, withPolicy: boolean) => {
    const created = await mgmt(url, ctx.key, "POST", "/mgmt/v1/products", {
      name: `Timing ${label}`,
      code: `timing-${label}-${Date.now().toString(36)}`,
      environment: "live",
    });
    const id = created.body.data.public_id as string;
    if (withPolicy) {
      const trial = await mgmt(url, ctx.key, "POST", "/mgmt/v1/policies", {
        product_id: id,
        name: "Trial",
        license_type: "trial",
        trial_days: 14,
      });
      await mgmt(url, ctx.key, "PATCH", `/mgmt/v1/products/${id}/trial-signup`, {
        policy_id: trial.body.data.public_id,
      });
    }
    return id;
  };
  const withTrials = await product("trial", true);
  const withoutTrials = await product("notrial", false);
  const classes: ClassSpec[] = [
    { name: "new address (sends)", sends: true },
    { name: "address inside its 120 s gap", sends: false },
    { name: "product without trial policy", sends: false },
  ];
  const body = (productId: string, email: string) =>
    JSON.stringify({
      product_id: productId,
      email,
      device_signing_public_key: deviceKey(),
      nonce: nonce(),
      locale: "en",
      sdk_version: "bench",
    });
  // Filled in by `primeRounds` right before the request's round.
  const plan = (cls: number): Planned => ({ cls, email: "", body: "" });
  const path = "/runtime/v1/trial-verifications";
  const labels = ["trial", "gap", "notrial"];
  /**
   * Every ROUND requests, unmeasured: a new address per request of the round and one start for
   * it, so each meets one verification of its own in the send-limit query: the gap class's was
   * sent its code (the product with trials), the others' were not (the product without).
   */
  const primeRounds = (items: Planned[]) => async (index: number) => {
    if (index % ROUND !== 0) return;
    const round = items.slice(index, index + ROUND);
    const primes = round.map((item): Planned => {
      item.email = freshAddress(labels[item.cls] as string);
      item.body = body(item.cls === 2 ? withoutTrials : withTrials, item.email);
      const gap = item.cls === 1;
      return {
        cls: gap ? 0 : 2,
        email: item.email,
        body: body(gap ? withTrials : withoutTrials, item.email),
      };
    });
    await runPlan(ctx, path, classes, primes, false);
    // The primes' mails are written 50-500 ms after their answers: before the round, not in it.
    await Bun.sleep(700);
  };
  return warmThenMeasure(ctx, {
    label: "trial verification",
    path,
    classes,
    warm: schedule(3, 100).map(plan),
    measured: schedule(3, ctx.perClass).map(plan),
    primeRounds,
  });
}

// ---------------------------------------------------------------------------------------------
/**
 * Starts its own server on a fresh data dir under `workDir` (pinned to `serverCpus`; the caller is
 * pinned to the other core), runs both routes and stops it.
 */
export async function verificationTiming(options: {
  workDir: string;
  serverCpus: string | null;
  log: (line: string) => void;
  env?: Record<string, string>;
  perClass?: number;
  gapMs?: number;
  /** Run this instead of the executable (e.g. the sources under Bun, to try a change). */
  command?: string[];
}): Promise<{
  routes: RouteTiming[];
  report: string;
  acceptance: [string, string, string, string, string][];
  pass: boolean;
}> {
  const dataDir = join(options.workDir, "timing-data");
  const logDir = join(options.workDir, "timing-logs");
  mkdirSync(logDir, { recursive: true });
  const init = await runCli(["init", "--data-dir", dataDir, "--json"]);
  if (init.exitCode !== 0) throw new Error(`init failed: ${init.stderr}`);
  const key = JSON.parse(init.stdout).api_keys.live as string;
  const server = await startServer({
    dataDir,
    port: await freePort(),
    cpus: options.serverCpus,
    logDir,
    env: options.env ?? TIMING_SERVER_ENV,
    command: options.command,
  });
  try {
    const plan = await mgmt(server.url, key, "GET", "/mgmt/v1/plan");
    const missing = (plan.body.data.unavailable_features as { key: string }[])
      .map((f) => f.key)
      .filter((f) => f === "email_license_verification" || f === "trial_licenses");
    if (missing.length > 0)
      throw new Error(`the workspace plan (${plan.body.data.plan.code}) lacks ${missing.join(", ")}`);
    const ctx: Context = {
      server,
      key,
      keys: await createApiKeys(dataDir, 8),
      dataDir,
      perClass: options.perClass ?? Number(process.env.BENCH_TIMING_REQUESTS ?? 2000),
      gapMs: options.gapMs ?? Number(process.env.BENCH_TIMING_GAP_MS ?? 2),
      log: options.log,
      expectedMail: new Map(),
      mailBefore: { expected: 0, found: 0 },
    };
    // The email run's primes age past their send gap while the trials run.
    const measureEmail = await prepareEmailVerification(ctx);
    const trials = await trialVerification(ctx);
    const routes = [await measureEmail(), trials];
    const { report, acceptance } = describeTiming(routes);
    return { routes, report, acceptance, pass: routes.every((r) => r.pass) };
  } finally {
    await server.stop("SIGTERM");
  }
}

if (import.meta.main) {
  const machine = machineInfo();
  const serverCpus = machine.cores >= 2 ? "0" : null;
  // As run.ts: this process (the client) on the last core, the server on core 0.
  if (machine.cores >= 2)
    Bun.spawnSync(["taskset", "-a", "-p", "-c", String(machine.cores - 1), String(process.pid)], {
      stdout: "ignore",
    });
  const startedAt = performance.now();
  const log = (line: string) =>
    console.log(`[${((performance.now() - startedAt) / 1000).toFixed(0).padStart(4)}s] ${line}`);
  const work = mkdtempSync(join(tmpdir(), "licensing-timing-"));
  let code = 1;
  try {
    log(
      `binary ${ensureBinary(log)}; server on CPU ${serverCpus ?? "(any)"}, client on CPU ${machine.cores - 1}`,
    );
    const result = await verificationTiming({ workDir: work, serverCpus, log });
    console.log(`\n${result.report}\n`);
    for (const row of result.acceptance) console.log(`${row[4]}  ${row[0]}: ${row[1]}, ${row[2]}`);
    code = result.pass ? 0 : 1;
  } finally {
    if (process.env.BENCH_KEEP === "1") console.log(`kept ${work}`);
    else rmSync(work, { recursive: true, force: true });
  }
  process.exit(code);
}
