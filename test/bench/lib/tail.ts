import { readFileSync } from "node:fs";

/**
 * What the slow requests of an open-model run had just before them. A virtual CPU can be taken
 * away by its hypervisor ("steal"), and the server itself pauses its writes to restart the WAL;
 * either stall, on a core kept 70-90% busy, leaves a queue that takes several times the stall to
 * drain. Counting the slow requests that completed shortly after each kind of event, against the
 * same windows moved by half a second (what chance alone puts there), says how much of the tail
 * each one explains.
 */

/** /proc/stat counts in clock ticks of 10 ms. */
const TICK_MS = 10;
/** A stall shows in the requests that complete up to this long after it... */
const AFTER_MS = 120;
/** ...and in those already waiting when the event was noticed (a tick is accounted at its end). */
const BEFORE_MS = 30;
/** The control windows: the same events, moved by this much. */
const CHANCE_SHIFT_MS = 500;

/**
 * Steal time of one CPU so far, in clock ticks: the 8th value of its line in /proc/stat ("cpuN
 * user nice system idle iowait irq softirq steal guest guest_nice"); undefined without that line.
 */
export function stealTicksOf(procStat: string, cpu: number): number | undefined {
  const line = procStat.split("\n").find((entry) => entry.startsWith(`cpu${cpu} `));
  const ticks = Number(line?.trim().split(/\s+/)[8]);
  return Number.isInteger(ticks) ? ticks : undefined;
}

export interface StealWatch {
  /**
   * Stops sampling: the steal time seen (NaN where it cannot be read: not Linux, no such CPU) and
   * when each tick of it was noticed (epoch ms).
   */
  stop(): { stealMs: number; at: number[] };
}

/**
 * Samples the steal time of `cpu` every few milliseconds (from the caller's process, which the
 * bench and latency.ts keep on the load generators' core).
 */
export function watchSteal(cpu: number, everyMs = 5): StealWatch {
  const read = () => {
    try {
      return stealTicksOf(readFileSync("/proc/stat", "utf8"), cpu);
    } catch {
      return undefined;
    }
  };
  const first = read();
  let last = first;
  const at: number[] = [];
  const timer =
    first === undefined
      ? undefined
      : setInterval(() => {
          // A failed read keeps the last count: the next one catches up.
          const now = read() ?? last ?? 0;
          for (let tick = last ?? now; tick < now; tick++) at.push(Date.now());
          last = now;
        }, everyMs);
  return {
    stop() {
      clearInterval(timer);
      return { stealMs: first === undefined ? Number.NaN : ((last ?? first) - first) * TICK_MS, at };
    },
  };
}

export interface SlowAfter {
  /** Slow requests that completed within [event - 30 ms, event + 120 ms] of some event. */
  near: number;
  /** The same count with every event moved by 500 ms: what chance puts in windows that size. */
  chance: number;
}

/** `slow` and `events` are epoch ms; `slow` the completion times of the slow requests. */
export function slowAfter(slow: readonly number[], events: readonly number[]): SlowAfter {
  const sorted = [...events].sort((a, b) => a - b);
  const count = (shift: number) =>
    slow.filter((done) => {
      // The first event that could still explain this request: not more than AFTER_MS before it.
      let low = 0;
      let high = sorted.length;
      while (low < high) {
        const mid = (low + high) >> 1;
        if ((sorted[mid] as number) + shift < done - AFTER_MS) low = mid + 1;
        else high = mid;
      }
      return low < sorted.length && (sorted[low] as number) + shift <= done + BEFORE_MS;
    }).length;
  return { near: count(0), chance: count(CHANCE_SHIFT_MS) };
}

/** A request slower than this inside the server is "slow" (the open-model target is a 10 ms p99). */
export const SLOW_MS = 10;

export interface ServerLogExtract {
  /** `duration_ms` of every request line, sorted. */
  durations: number[];
  /** When each request over SLOW_MS completed (its line's `ts`, epoch ms). */
  slowAt: number[];
  /** The WAL restarts the server logged (debug level). */
  restarts: { at: number; writesHeldMs: number; caughtUp: boolean }[];
}

/** The request and WAL-restart lines of a server log, from byte `from` on. */
export function readServerLog(logPath: string, from = 0): ServerLogExtract {
  const text = readFileSync(logPath).subarray(from).toString("utf8");
  const durations: number[] = [];
  const slowAt: number[] = [];
  const restarts: ServerLogExtract["restarts"] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith('{"ts"')) continue;
    let entry: {
      ts: string;
      msg: string;
      duration_ms?: number;
      writes_held_ms?: number;
      caught_up?: boolean;
    };
    try {
      entry = JSON.parse(line);
    } catch {
      continue; // A line cut by the read.
    }
    if (entry.msg === "request" && typeof entry.duration_ms === "number") {
      durations.push(entry.duration_ms);
      if (entry.duration_ms > SLOW_MS) slowAt.push(Date.parse(entry.ts));
    } else if (entry.msg === "wal restart") {
      restarts.push({
        at: Date.parse(entry.ts),
        writesHeldMs: entry.writes_held_ms ?? Number.NaN,
        caughtUp: entry.caught_up === true,
      });
    }
  }
  durations.sort((a, b) => a - b);
  return { durations, slowAt, restarts };
}
