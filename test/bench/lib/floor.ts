import { join } from "node:path";
import type { Subprocess } from "bun";
import { freePort } from "../../e2e/binary.ts";
import { type BenchRequest, writeRequestFile } from "./requests.ts";
import type { RunContext } from "./run-context.ts";
import { pinned } from "./server.ts";
import { runWrk } from "./wrk.ts";

/**
 * The floor: what every request of a route cannot avoid, on the server's core of this machine.
 *
 * This machine's speed moves within a second (the same Ed25519 verify loop takes 51 µs in one
 * 200 ms window and 104 µs a second later: a virtual CPU shares its core), so a floor measured at
 * another time than a route cannot judge it. The meter therefore stays up for the whole run and
 * measures the floor in slices that alternate with each route's own slices (route-run.ts): a route
 * is judged against the floor of the seconds it ran in.
 */

/** How long the meter waits for floor-ops to answer a slice before it gives the run up. */
const REPLY_TIMEOUT_MS = 60_000;

/**
 * The floor's operations, by the names floor-ops.ts reports them under (µs per call). The last two
 * are the writes each route cannot do without, in one transaction (the activation floor counts
 * them).
 */
export const FLOOR_OPERATIONS = [
  "verify_us",
  "sign_us",
  "read_us",
  "write_us",
  "append_us",
  "page50_us",
  "heartbeat_write_us",
  "activation_write_us",
] as const;
export type FloorOperation = (typeof FLOOR_OPERATIONS)[number];

/** µs per operation. */
export type FloorOps = Record<FloorOperation, number>;

type OpTotals = Record<FloorOperation, [number, number]>;

/** What the floor's slices measured over some stretch of the run: sums, so stretches add up. */
export interface FloorTally {
  ops: OpTotals;
  /** The bare HTTP server's CPU seconds and the requests it answered in its slices. */
  httpCpuSec: number;
  httpRequests: number;
  httpWallSec: number;
}

export const emptyTally = (): FloorTally => ({
  ops: Object.fromEntries(FLOOR_OPERATIONS.map((name) => [name, [0, 0]])) as OpTotals,
  httpCpuSec: 0,
  httpRequests: 0,
  httpWallSec: 0,
});

export function addTally(into: FloorTally, from: FloorTally): FloorTally {
  for (const name of FLOOR_OPERATIONS) {
    into.ops[name][0] += from.ops[name][0];
    into.ops[name][1] += from.ops[name][1];
  }
  into.httpCpuSec += from.httpCpuSec;
  into.httpRequests += from.httpRequests;
  into.httpWallSec += from.httpWallSec;
  return into;
}

/** The floor a tally measured: µs per operation, and the HTTP + JSON floor's CPU µs per request. */
export function floorOf(tally: FloorTally): { ops: FloorOps; httpUs: number } {
  const ops = {} as FloorOps;
  for (const name of FLOOR_OPERATIONS) {
    const [us, calls] = tally.ops[name];
    if (!(calls > 0)) throw new Error(`the floor slices measured no ${name.replace(/_us$/, "")}`);
    ops[name] = us / calls;
  }
  if (!(tally.httpRequests > 0)) throw new Error("the floor slices measured no HTTP request");
  return { ops, httpUs: (tally.httpCpuSec * 1e6) / tally.httpRequests };
}

/**
 * floor-ops.ts --serve and floor-http.ts, both pinned to the server's core, idle between slices.
 * `slice()` measures one floor slice: the operations for `opsMs`, then the bare HTTP server under
 * wrk (driven exactly like the heartbeat route: the same requests, connections and core) for
 * `httpSec`.
 */
export class FloorMeter {
  readonly total = emptyTally();
  private buffered = "";
  private readonly reader: ReadableStreamDefaultReader<Uint8Array>;
  private readonly decoder = new TextDecoder();

  private constructor(
    private readonly ctx: RunContext,
    private readonly ops: Subprocess<"pipe", "pipe", "inherit">,
    private readonly http: Subprocess<"ignore", "ignore", "inherit">,
    private readonly httpUrl: string,
    private readonly httpFile: string,
  ) {
    this.reader = ops.stdout.getReader();
  }

  /**
   * Starts both; `heartbeats(n)` makes the requests the HTTP floor replays (it verifies nothing,
   * so a thousand of them repeated serve every slice), `responseBytes` is the size of its answer.
   */
  static async start(
    ctx: RunContext,
    responseBytes: number,
    heartbeats: (n: number) => BenchRequest[],
  ): Promise<FloorMeter> {
    // Both are killed when the run ends, whatever happens (run.ts), and floor-ops keeps its store
    // in the run's work dir, removed with it.
    const ops = Bun.spawn(
      pinned(ctx.serverCpus, [ctx.bun, join(ctx.benchDir, "floor-ops.ts"), "--serve", ctx.work]),
      { stdin: "pipe", stdout: "pipe", stderr: "inherit" },
    );
    ctx.children.add(ops);
    const port = await freePort();
    const http = Bun.spawn(
      pinned(ctx.serverCpus, [
        ctx.bun,
        join(ctx.benchDir, "floor-http.ts"),
        String(port),
        String(responseBytes),
      ]),
      { stdin: "ignore", stdout: "ignore", stderr: "inherit" },
    );
    ctx.children.add(http);
    const httpUrl = `http://127.0.0.1:${port}`;
    let listening = false;
    for (let i = 0; i < 200 && !listening; i++) {
      try {
        listening = (await fetch(`${httpUrl}/`)).status === 200;
      } catch {
        await Bun.sleep(25);
      }
    }
    if (!listening) throw new Error(`floor-http did not answer on ${httpUrl}`);
    // A thousand requests, replayed round and round (the bare server verifies nothing).
    const httpFile = ctx.requestFile();
    writeRequestFile(httpFile, heartbeats(1000));
    const meter = new FloorMeter(ctx, ops, http, httpUrl, httpFile);
    const ready = await meter.line();
    if (ready !== "ready") throw new Error(`floor-ops --serve said ${JSON.stringify(ready)}`);
    // The HTTP floor's warm-up: its first measured slice would otherwise pay for the JIT.
    await meter.httpRun(1);
    return meter;
  }

  /** One floor slice; returns what it measured and adds it to `total`. */
  async slice(opsMs: number, httpSec: number): Promise<FloorTally> {
    const tally = emptyTally();
    this.ops.stdin.write(`${opsMs}\n`);
    this.ops.stdin.flush();
    tally.ops = JSON.parse(await this.line()) as OpTotals;

    const before = await this.httpCpuSec();
    const run = await this.httpRun(httpSec);
    tally.httpCpuSec = (await this.httpCpuSec()) - before;
    tally.httpRequests = run.requests;
    tally.httpWallSec = run.durationSec;
    addTally(this.total, tally);
    return tally;
  }

  async stop(): Promise<void> {
    this.ops.stdin.end();
    this.http.kill("SIGTERM");
    const both = Promise.all([this.ops.exited, this.http.exited]);
    // Neither holds state worth a clean exit: one that hangs is killed rather than hang the run.
    if ((await Promise.race([both, Bun.sleep(10_000).then(() => null)])) === null) {
      this.ops.kill("SIGKILL");
      this.http.kill("SIGKILL");
      await both;
    }
    this.ctx.children.delete(this.ops);
    this.ctx.children.delete(this.http);
  }

  private httpRun(durationSec: number) {
    return runWrk({
      url: this.httpUrl,
      file: this.httpFile,
      durationSec,
      connections: this.ctx.config.connections,
      cpus: this.ctx.loadCpus,
      cycle: true,
    });
  }

  /** The bare server's own CPU time (process.cpuUsage, µs resolution: /proc counts 10 ms ticks). */
  private async httpCpuSec(): Promise<number> {
    const answer = (await (await fetch(`${this.httpUrl}/cpu`)).json()) as { cpu_us: number };
    return answer.cpu_us / 1e6;
  }

  private async line(): Promise<string> {
    const deadline = performance.now() + REPLY_TIMEOUT_MS;
    for (;;) {
      const end = this.buffered.indexOf("\n");
      if (end >= 0) {
        const line = this.buffered.slice(0, end);
        this.buffered = this.buffered.slice(end + 1);
        return line;
      }
      let timer: Timer | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`floor-ops --serve did not answer in ${REPLY_TIMEOUT_MS / 1000} s`)),
          Math.max(0, deadline - performance.now()),
        );
      });
      try {
        const { value, done } = await Promise.race([this.reader.read(), timeout]);
        if (done) throw new Error("floor-ops --serve exited");
        this.buffered += this.decoder.decode(value, { stream: true });
      } finally {
        clearTimeout(timer);
      }
    }
  }
}
