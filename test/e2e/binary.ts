import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { ensureExecutable } from "../../build/compile.ts";

/**
 * Helpers for driving the compiled executable as an operator would: real processes, real files,
 * real HTTP on a free port. Builds the executable first when any source is newer than it.
 */
export const BUILD_TIMEOUT_MS = 180_000;

let built: string | undefined;
/** Checked once per test process, so a source edited during the run does not trigger a rebuild. */
export const executable = (): string => {
  built ??= ensureExecutable();
  return built;
};

const dirs: string[] = [];

export function tempDir(prefix = "licensing-e2e-"): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  dirs.push(dir);
  return dir;
}

export function removeTempDirs(): void {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
}

/** Only what a process needs; LICENSING_* from the developer's shell must not leak into tests. */
export function cleanEnv(extra: Record<string, string> = {}): Record<string, string> {
  return { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: tmpdir(), ...extra };
}

export interface CliResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

export async function runCli(
  args: string[],
  options: { cwd?: string; env?: Record<string, string> } = {},
): Promise<CliResult> {
  const proc = Bun.spawn([executable(), ...args], {
    cwd: options.cwd ?? tmpdir(),
    env: cleanEnv(options.env),
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  const [stdout, stderr, exitCode] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ]);
  return { exitCode, stdout, stderr };
}

export async function freePort(): Promise<number> {
  const probe = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(null) });
  const port = probe.port;
  await probe.stop(true);
  if (port === undefined) throw new Error("no free port");
  return port;
}

/** Collects a stream into a string as it arrives, so a running server's output can be read. */
function collect(stream: ReadableStream<Uint8Array>): { text: () => string; done: Promise<void> } {
  let text = "";
  const decoder = new TextDecoder();
  const done = (async () => {
    for await (const chunk of stream) text += decoder.decode(chunk, { stream: true });
  })();
  return { text: () => text, done };
}

export interface ServerProcess {
  proc: Subprocess<"ignore", "pipe", "pipe">;
  url: string;
  port: number;
  stdout(): string;
  stderr(): string;
  /** The JSON log lines written so far. */
  logs(): Record<string, unknown>[];
  /**
   * The first log line `matches` accepts, waiting up to 5 s for it: lines cross a pipe, and one
   * written before /readyz answered may not have been read yet when the answer arrives.
   */
  logLine(matches: (line: Record<string, unknown>) => boolean): Promise<Record<string, unknown> | undefined>;
  /** Sends a signal and waits for the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number>;
}

export interface StartOptions {
  cwd?: string;
  env?: Record<string, string>;
  port?: number;
}

/** Starts `licensing serve` and waits until /readyz answers 200, or fails with the server's output. */
export async function startServe(args: string[], options: StartOptions = {}): Promise<ServerProcess> {
  const port = options.port ?? (await freePort());
  const proc = Bun.spawn([executable(), "serve", "--port", String(port), ...args], {
    cwd: options.cwd ?? tmpdir(),
    env: cleanEnv(options.env),
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  const out = collect(proc.stdout);
  const err = collect(proc.stderr);
  const url = `http://127.0.0.1:${port}`;
  const server: ServerProcess = {
    proc,
    url,
    port,
    stdout: out.text,
    stderr: err.text,
    logs: () =>
      err
        .text()
        .split("\n")
        .filter((line) => line.startsWith("{"))
        .map((line) => JSON.parse(line) as Record<string, unknown>),
    async logLine(matches) {
      for (let waited = 0; waited < 5_000; waited += 20) {
        const line = server.logs().find(matches);
        if (line) return line;
        await Bun.sleep(20);
      }
      return server.logs().find(matches);
    },
    async stop(signal = "SIGTERM") {
      proc.kill(signal);
      const code = await proc.exited;
      await Promise.all([out.done, err.done]);
      return code;
    },
  };
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) break;
    try {
      const response = await fetch(`${url}/readyz`);
      if (response.status === 200) return server;
    } catch {
      // Not listening yet.
    }
    await Bun.sleep(50);
  }
  proc.kill("SIGKILL");
  await proc.exited;
  await Promise.all([out.done, err.done]);
  throw new Error(
    `the server did not become ready (exit ${proc.exitCode})\nstdout:\n${out.text()}\nstderr:\n${err.text()}`,
  );
}

/** Waits for a process that is expected to fail at start-up; returns its exit code and output. */
export async function runServeToExit(
  args: string[],
  options: StartOptions = {},
): Promise<CliResult & { port: number }> {
  const port = options.port ?? (await freePort());
  const result = await Promise.race([
    runCli(["serve", "--port", String(port), ...args], options),
    Bun.sleep(20_000).then(() => {
      throw new Error("serve did not exit");
    }),
  ]);
  return { ...result, port };
}

export interface HttpResult {
  status: number;
  headers: Headers;
  // biome-ignore lint/suspicious/noExplicitAny: tests read arbitrary JSON response shapes.
  body: any;
}

let idempotencyCounter = 0;

/** One management call over real HTTP; POSTs get a fresh Idempotency-Key unless one is given. */
export async function api(
  url: string,
  key: string | null,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<HttpResult> {
  const all: Record<string, string> = { ...headers };
  if (key !== null) all.authorization = `Bearer ${key}`;
  if (body !== undefined) all["content-type"] = "application/json";
  if (method === "POST" && all["idempotency-key"] === undefined) {
    all["idempotency-key"] = `e2e-${process.pid}-${Date.now()}-${++idempotencyCounter}`;
  }
  const response = await fetch(`${url}${path}`, {
    method,
    headers: all,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let parsed: unknown = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = text;
  }
  return { status: response.status, headers: response.headers, body: parsed };
}

/** True when something accepts connections on the port. */
export async function isListening(port: number): Promise<boolean> {
  try {
    await fetch(`http://127.0.0.1:${port}/healthz`, { signal: AbortSignal.timeout(1000) });
    return true;
  } catch {
    return false;
  }
}

/** A fresh data dir made by `licensing init --json` (builds the executable first if needed). */
export async function initialisedDataDir(): Promise<{ dataDir: string; liveKey: string }> {
  executable();
  const dataDir = join(tempDir(), "data");
  const init = await runCli(["init", "--data-dir", dataDir, "--json"]);
  if (init.exitCode !== 0) throw new Error(`init failed: ${init.stderr}`);
  return { dataDir, liveKey: (JSON.parse(init.stdout) as { api_keys: { live: string } }).api_keys.live };
}
