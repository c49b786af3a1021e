import { readFileSync } from "node:fs";
import { fixed, table } from "./report.ts";
import { ascending, bootstrapMedianDifference, kolmogorovSmirnov, median, quantile } from "./stats.ts";

/**
 * Analysis and report of the verification timing bench (../verification-timing.ts): per-class
 * quantiles, each silent class against the sending one, and the PASS/FAIL criterion of
 * docs/performance.md "Verification timing".
 */

/** Criterion (docs/performance.md): the median difference is noise and the distributions agree. */
export const RELATIVE_TOLERANCE = 0.05;
export const KS_ALPHA = 0.01;

export interface ClassSpec {
  name: string;
  /** Whether a start of this class must put a mail in the outbox. */
  sends: boolean;
}

export interface Sample {
  cls: number;
  ms: number;
  requestId: string | null;
  /** Class of the request just before, -1 for the first. */
  previous: number;
}

export interface Comparison {
  against: string;
  differenceMs: number;
  lowMs: number;
  highMs: number;
  relative: number;
  ks: { d: number; p: number };
  inServer: { differenceMs: number; ks: { d: number; p: number } };
  pass: boolean;
}

export interface RouteTiming {
  route: string;
  classes: {
    name: string;
    sends: boolean;
    n: number;
    p50: number;
    p90: number;
    p99: number;
    inServerP50: number;
  }[];
  comparisons: Comparison[];
  afterSending: { differenceMs: number; ks: { d: number; p: number } };
  statuses: Record<string, number>;
  outbox: { expected: number; found: number; mismatches: string[] };
  otherCpuPct: number;
  serverCpuPct: number;
  seconds: number;
  pass: boolean;
}

/** duration_ms of each request id in the server's log (time inside the server, no network). */
export function serverDurations(logPath: string): Map<string, number> {
  const durations = new Map<string, number>();
  for (const line of readFileSync(logPath, "utf8").split("\n")) {
    if (!line.includes('"msg":"request"')) continue;
    try {
      const entry = JSON.parse(line) as { request_id?: string; duration_ms?: number };
      if (entry.request_id && typeof entry.duration_ms === "number")
        durations.set(entry.request_id, entry.duration_ms);
    } catch {
      // Not a whole JSON line.
    }
  }
  return durations;
}

export function analyse(
  logPath: string,
  route: string,
  classes: ClassSpec[],
  samples: Sample[],
  statuses: Record<string, number>,
  outbox: RouteTiming["outbox"],
  load: { otherCpuPct: number; serverCpuPct: number; seconds: number },
): RouteTiming {
  const inServer = serverDurations(logPath);
  const of = (cls: number) => samples.filter((s) => s.cls === cls).map((s) => s.ms);
  const inServerOf = (cls: number) =>
    samples
      .filter((s) => s.cls === cls)
      .map((s) => (s.requestId ? inServer.get(s.requestId) : undefined))
      .filter((d): d is number => d !== undefined);
  const rows = classes.map((spec, cls) => {
    const sorted = ascending(of(cls));
    return {
      name: spec.name,
      sends: spec.sends,
      n: sorted.length,
      p50: median(sorted),
      p90: quantile(sorted, 0.9),
      p99: quantile(sorted, 0.99),
      inServerP50: median(ascending(inServerOf(cls))),
    };
  });
  const reference = of(0);
  const comparisons: Comparison[] = classes.slice(1).map((spec, i) => {
    const other = of(i + 1);
    const boot = bootstrapMedianDifference(reference, other, { seed: 7 + i });
    const ks = kolmogorovSmirnov(reference, other);
    const pooledMedian = median(ascending([...reference, ...other]));
    const relative = Math.abs(boot.difference) / pooledMedian;
    const a = inServerOf(0);
    const b = inServerOf(i + 1);
    return {
      against: spec.name,
      differenceMs: boot.difference,
      lowMs: boot.low,
      highMs: boot.high,
      relative,
      ks,
      inServer: {
        differenceMs: median(ascending(b)) - median(ascending(a)),
        ks: kolmogorovSmirnov(a, b),
      },
      pass: ((boot.low <= 0 && boot.high >= 0) || relative < RELATIVE_TOLERANCE) && ks.p > KS_ALPHA,
    };
  });
  // A second channel, information only: does a request take longer right after a sending start?
  const afterSend = samples.filter((s) => s.previous >= 0 && classes[s.previous]?.sends).map((s) => s.ms);
  const afterSilent = samples.filter((s) => s.previous >= 0 && !classes[s.previous]?.sends).map((s) => s.ms);
  const all202 = Object.keys(statuses).every((status) => status === "202");
  return {
    route,
    classes: rows,
    comparisons,
    afterSending: {
      differenceMs: median(ascending(afterSend)) - median(ascending(afterSilent)),
      ks: kolmogorovSmirnov(afterSilent, afterSend),
    },
    statuses,
    outbox,
    ...load,
    pass: all202 && outbox.mismatches.length === 0 && comparisons.every((c) => c.pass),
  };
}

const ms = (value: number) => fixed(value, 3);
const signedMs = (value: number) => `${value >= 0 ? "+" : ""}${fixed(value, 3)}`;

/** The section as run.ts prints it, and the summary rows (target, measured, value, by CPU, result). */
export function describeTiming(routes: RouteTiming[]): {
  report: string;
  acceptance: [string, string, string, string, string][];
} {
  const lines: string[] = ["## Verification timing (202 of a sending vs a silent start)", ""];
  for (const route of routes) {
    lines.push(
      `### POST ${route.route}`,
      "",
      table(
        ["class", "sends", "n", "p50 ms", "p90 ms", "p99 ms", "in-server p50 ms"],
        route.classes.map((c) => [
          c.name,
          c.sends ? "yes" : "no",
          String(c.n),
          ms(c.p50),
          ms(c.p90),
          ms(c.p99),
          ms(c.inServerP50),
        ]),
        ["l", "l", "r", "r", "r", "r", "r"],
      ),
      "",
      table(
        [
          "vs the sending class",
          "Δ median ms",
          "95% CI ms",
          "|Δ| / median",
          "KS D",
          "KS p",
          "in-server Δ ms",
          "in-server KS p",
          "result",
        ],
        route.comparisons.map((c) => [
          c.against,
          signedMs(c.differenceMs),
          `[${signedMs(c.lowMs)}, ${signedMs(c.highMs)}]`,
          `${fixed(c.relative * 100, 1)}%`,
          fixed(c.ks.d, 3),
          fixed(c.ks.p, 3),
          signedMs(c.inServer.differenceMs),
          fixed(c.inServer.ks.p, 3),
          c.pass ? "PASS" : "FAIL",
        ]),
        ["l", "r", "r", "r", "r", "r", "r", "r", "l"],
      ),
      "",
      `statuses ${JSON.stringify(route.statuses)}; outbox: ${route.outbox.found} mails written, ${route.outbox.expected} expected${route.outbox.mismatches.length ? `, MISMATCH: ${route.outbox.mismatches.slice(0, 5).join("; ")}` : ", every sending start mailed and no silent one"}; request right after a sending start vs after a silent one (info): Δ median ${signedMs(route.afterSending.differenceMs)} ms, KS p ${fixed(route.afterSending.ks.p, 3)}; ${fixed(route.seconds, 1)} s, server CPU ${fixed(route.serverCpuPct)}%, other processes ${fixed(route.otherCpuPct)}% of a core.`,
      "",
    );
  }
  lines.push(
    `PASS per comparison: (the 95% CI of Δ median includes 0, or |Δ median| < ${RELATIVE_TOLERANCE * 100}% of the median) and KS p > ${KS_ALPHA}; a route passes when every comparison does, every answer was 202 and the outbox holds exactly the mails of the sending class.`,
  );
  const acceptance = routes.map((route): [string, string, string, string, string] => {
    const worst = route.comparisons.reduce((a, b) =>
      Math.abs(b.differenceMs) > Math.abs(a.differenceMs) ? b : a,
    );
    const minP = Math.min(...route.comparisons.map((c) => c.ks.p));
    return [
      `${route.route} 202 timing: sending = silent`,
      `Δ median ${signedMs(worst.differenceMs)} ms [${signedMs(worst.lowMs)}, ${signedMs(worst.highMs)}]`,
      `lowest KS p ${fixed(minP, 3)}`,
      "-",
      route.pass ? "PASS" : "FAIL",
    ];
  });
  return { report: lines.join("\n"), acceptance };
}
