import { readFileSync } from "node:fs";
import { encodeRequest, Http1Connection } from "./lib/http1.ts";
import { parseRequestLine } from "./lib/requests.ts";

/**
 * Open-model load generator: request i is due at start + i / RATE, whatever happened to the ones
 * before it, and its latency is measured from that scheduled time to the end of its response, so
 * time spent queued (in the generator, the kernel or the server) is counted, not hidden. A request
 * due while every connection is busy opens another connection (up to MAX_CONNECTIONS, then it waits
 * in a queue, still on the clock). One process, one JS thread: run.ts pins it to one core.
 *
 * Usage: bun test/bench/open-loop.ts URL FILE RATE DURATION_SEC
 * Prints one JSON line: counts per status, latency percentiles (ms) from the scheduled time, and how
 * late the generator itself sent (so a slow generator would show).
 */
const [url = "", file = "", rateText = "", durationText = ""] = process.argv.slice(2);
const rate = Number(rateText);
const durationSec = Number(durationText);
const MAX_CONNECTIONS = 1024;
const INITIAL_CONNECTIONS = 32;

const target = new URL(url);
const host = target.host;
const port = Number(target.port);
const lines = readFileSync(file, "utf8").split("\n").filter(Boolean);
const total = Math.min(lines.length, Math.floor(rate * durationSec));
if (total < rate * durationSec * 0.99) {
  console.error(
    `open-loop: the file has ${lines.length} requests, ${Math.ceil(rate * durationSec)} are needed`,
  );
  process.exit(2);
}
const raws = lines.slice(0, total).map((line) => encodeRequest(parseRequestLine(line), host));

const idle: Http1Connection[] = [];
let connections = 0;
let maxInFlight = 0;
let inFlight = 0;
const waiting: number[] = [];
const latencies: number[] = [];
const lateness: number[] = [];
const statuses: Record<string, number> = {};
let completed = 0;
let failed = 0;

/** A connection the server closes while idle (keep-alive timeout) leaves the pool at once. */
async function connect(): Promise<Http1Connection> {
  const connection = await Http1Connection.connect(target.hostname, port);
  connections++;
  connection.onClose = () => {
    connections--;
    const at = idle.indexOf(connection);
    if (at !== -1) idle.splice(at, 1);
  };
  return connection;
}

for (let i = 0; i < INITIAL_CONNECTIONS; i++) idle.push(await connect());

const start = performance.now() + 100;
const interval = 1000 / rate;
const due = (i: number) => start + i * interval;
let finish: () => void = () => {};
const finished = new Promise<void>((resolve) => {
  finish = resolve;
});

function settle(i: number, status: string): void {
  latencies.push(performance.now() - due(i));
  statuses[status] = (statuses[status] ?? 0) + 1;
  completed++;
  inFlight--;
  if (completed + failed === total) finish();
}

function fail(): void {
  failed++;
  inFlight--;
  statuses.error = (statuses.error ?? 0) + 1;
  if (completed + failed === total) finish();
}

/**
 * Sends request i on `connection`. A reused keep-alive connection that the server closed just as
 * the request went out (no byte of an answer came back) is retried once on a new connection, still
 * on the clock of the scheduled time.
 */
async function send(i: number, connection: Http1Connection, retried = false): Promise<void> {
  if (!retried) lateness.push(performance.now() - due(i));
  try {
    const response = await connection.request(raws[i] as Uint8Array);
    settle(i, String(response.status));
  } catch {
    if (!retried && connection.failedBeforeResponse) {
      try {
        await send(i, await connect(), true);
      } catch {
        fail();
      }
      return;
    }
    fail();
    return;
  }
  if (connection.open) release(connection);
}

function release(connection: Http1Connection): void {
  const next = waiting.shift();
  if (next !== undefined) void send(next, connection);
  else idle.push(connection);
}

async function dispatch(i: number): Promise<void> {
  inFlight++;
  maxInFlight = Math.max(maxInFlight, inFlight);
  const connection = idle.pop();
  if (connection) return send(i, connection);
  if (connections >= MAX_CONNECTIONS) {
    waiting.push(i);
    return;
  }
  try {
    await send(i, await connect());
  } catch {
    fail();
  }
}

let next = 0;
function tick(): void {
  const now = performance.now();
  while (next < total && due(next) <= now) void dispatch(next++);
  if (next >= total) return;
  const wait = due(next) - performance.now();
  if (wait > 2) setTimeout(tick, wait - 1);
  else setImmediate(tick);
}
setTimeout(tick, Math.max(0, start - performance.now() - 1));
await Promise.race([finished, Bun.sleep(durationSec * 1000 + 30_000)]);

const endedAt = performance.now();
const percentile = (values: number[], p: number): number => {
  const sorted = Float64Array.from(values).sort();
  return (
    sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))] ?? Number.NaN
  );
};
console.log(
  JSON.stringify({
    rate,
    duration_sec: durationSec,
    scheduled: total,
    completed,
    failed,
    statuses,
    achieved_rps: completed / ((endedAt - start) / 1000),
    connections,
    max_in_flight: maxInFlight,
    latency_ms: {
      p50: percentile(latencies, 50),
      p90: percentile(latencies, 90),
      p99: percentile(latencies, 99),
      p999: percentile(latencies, 99.9),
      max: percentile(latencies, 100),
    },
    send_lateness_ms: { p50: percentile(lateness, 50), p99: percentile(lateness, 99) },
  }),
);
for (const connection of idle) connection.close();
process.exit(0);
