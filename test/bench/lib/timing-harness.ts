import { generateKeyPairSync } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { publicKeyText } from "../../../src/crypto/keys.ts";
import { cpuSeconds, machineBusySeconds } from "./procstat.ts";
import type { BenchServer } from "./server.ts";
import { seededRandom } from "./stats.ts";
import { analyse, type ClassSpec, type RouteTiming, type Sample } from "./timing-analysis.ts";

/**
 * How verification-timing.ts sends and measures its starts: one at a time over keep-alive HTTP,
 * in a shuffled order of classes, with the outbox counted afterwards and the machine's load
 * measured around the run. What each route's classes are lives in verification-timing.ts.
 */

/** Requests per round: the addresses that must meet a fresh earlier start are made and started right before it. */
export const ROUND = 300;

export interface Planned {
  cls: number;
  body: string;
  /** The address the body names, for the outbox check. */
  email: string;
}

export interface Context {
  server: BenchServer;
  key: string;
  /** More live API keys, so the email route's many users are made in parallel (and primes sent 8 at a time). */
  keys: string[];
  dataDir: string;
  perClass: number;
  gapMs: number;
  log: (line: string) => void;
  /** Mails each address must have received once the run is over (every route so far). */
  expectedMail: Map<string, number>;
  /** Totals of the routes checked before, so each route reports its own mails. */
  mailBefore: { expected: number; found: number };
}

const random = seededRandom(Date.now() & 0xffffffff);
let addressCounter = 0;
export const freshAddress = (label: string) =>
  `${label}-${Date.now().toString(36)}-${++addressCounter}@example.com`;
export const deviceKey = () => publicKeyText(generateKeyPairSync("ed25519").publicKey);

function shuffled<T>(items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [items[i], items[j]] = [items[j] as T, items[i] as T];
  }
  return items;
}

/** `perClass` of each class, shuffled together. */
export const schedule = (classes: number, perClass: number): number[] =>
  shuffled(Array.from({ length: classes * perClass }, (_, i) => i % classes));

export async function post(
  ctx: Context,
  path: string,
  body: string,
): Promise<{ status: number; requestId: string | null; ms: number }> {
  const started = performance.now();
  const response = await fetch(`${ctx.server.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  await response.arrayBuffer();
  const ms = performance.now() - started;
  return { status: response.status, requestId: response.headers.get("x-request-id"), ms };
}

const expectMail = (ctx: Context, email: string) =>
  ctx.expectedMail.set(email, (ctx.expectedMail.get(email) ?? 0) + 1);

/**
 * Sends `plan` one request at a time (the next after the previous answer and a `gapMs` pause, so
 * the mail worker's work after a sending start does not land in the next request), timing each.
 */
export async function runPlan(
  ctx: Context,
  path: string,
  classes: ClassSpec[],
  plan: Planned[],
  measured: boolean,
  beforeEach?: (index: number) => Promise<void>,
): Promise<{ samples: Sample[]; statuses: Record<string, number> }> {
  const samples: Sample[] = [];
  const statuses: Record<string, number> = {};
  let previous = -1;
  for (const [index, item] of plan.entries()) {
    await beforeEach?.(index);
    const result = await post(ctx, path, item.body);
    statuses[result.status] = (statuses[result.status] ?? 0) + 1;
    if (result.status === 202 && classes[item.cls]?.sends) expectMail(ctx, item.email);
    if (measured) samples.push({ cls: item.cls, ms: result.ms, requestId: result.requestId, previous });
    previous = item.cls;
    if (ctx.gapMs > 0) await Bun.sleep(ctx.gapMs);
  }
  return { samples, statuses };
}

/** Waits for the mail worker to write every pending mail, then counts the .eml files per recipient. */
export async function outboxCheck(ctx: Context): Promise<RouteTiming["outbox"]> {
  const dir = join(ctx.dataDir, "outbox");
  const expected = [...ctx.expectedMail.values()].reduce((a, b) => a + b, 0);
  const files = () => readdirSync(dir, { withFileTypes: true }).filter((f) => f.name.endsWith(".eml"));
  let last = -1;
  for (let i = 0; i < 120; i++) {
    const count = files().length;
    if (count >= expected && count === last) break;
    last = count;
    await Bun.sleep(250);
  }
  const found = new Map<string, number>();
  for (const file of files()) {
    const head = readFileSync(join(dir, file.name), "utf8").split("\r\n\r\n")[0] ?? "";
    const to = /^To: (.*)$/m.exec(head)?.[1]?.trim().toLowerCase() ?? "?";
    found.set(to, (found.get(to) ?? 0) + 1);
  }
  const mismatches: string[] = [];
  for (const address of new Set([...found.keys(), ...ctx.expectedMail.keys()])) {
    const want = ctx.expectedMail.get(address) ?? 0;
    const got = found.get(address) ?? 0;
    if (want !== got) mismatches.push(`${address}: expected ${want}, found ${got}`);
  }
  const total = { expected, found: [...found.values()].reduce((a, b) => a + b, 0) };
  const own = {
    expected: total.expected - ctx.mailBefore.expected,
    found: total.found - ctx.mailBefore.found,
  };
  ctx.mailBefore = total;
  return { ...own, mismatches };
}

/** Measures the load around `body`: this process, the server and everything else on the machine. */
export async function underLoad<T>(ctx: Context, body: () => Promise<T>) {
  const busy = machineBusySeconds();
  const self = process.cpuUsage();
  const server = cpuSeconds(ctx.server.pid);
  const started = performance.now();
  const result = await body();
  const seconds = (performance.now() - started) / 1000;
  const own = process.cpuUsage(self);
  const serverCpu = cpuSeconds(ctx.server.pid) - server;
  const other = machineBusySeconds() - busy - serverCpu - (own.user + own.system) / 1e6;
  return {
    result,
    load: {
      otherCpuPct: Math.max(0, (other / seconds) * 100),
      serverCpuPct: (serverCpu / seconds) * 100,
      seconds,
    },
  };
}

/** Runs `task` for every item, `keys.length` at a time, each worker with its own API key (100/s each). */
export async function eachWithKeys<T>(
  keys: string[],
  items: T[],
  task: (item: T, key: string) => Promise<void>,
) {
  let next = 0;
  await Promise.all(
    keys.map(async (key) => {
      while (next < items.length) await task(items[next++] as T, key);
    }),
  );
}

/**
 * A route's run: `warm` unmeasured, then `measured` with the load around it measured, each round
 * primed by `primeRounds`; the latencies, statuses and outbox judged by `analyse`.
 */
export async function warmThenMeasure(
  ctx: Context,
  route: {
    label: string;
    path: string;
    classes: ClassSpec[];
    warm: Planned[];
    measured: Planned[];
    primeRounds: (items: Planned[]) => (index: number) => Promise<void>;
  },
): Promise<RouteTiming> {
  const { label, path, classes, warm, measured, primeRounds } = route;
  await runPlan(ctx, path, classes, warm, false, primeRounds(warm));
  ctx.log(`  ${label}: ${measured.length} starts (${ctx.perClass} per class) ...`);
  const { result, load } = await underLoad(ctx, () =>
    runPlan(ctx, path, classes, measured, true, primeRounds(measured)),
  );
  return analyse(
    ctx.server.logPath,
    path,
    classes,
    result.samples,
    result.statuses,
    await outboxCheck(ctx),
    load,
  );
}
