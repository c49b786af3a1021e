import { afterEach, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { jsonLogger, stderrLines } from "../../src/http/logger.ts";

const dir = mkdtempSync(join(tmpdir(), "licensing-log-"));
const path = join(dir, "stderr.log");
let fd: number;
afterEach(() => closeSync(fd));
const written = () => readFileSync(path, "utf8");

test("request lines are written together after the current turn, in order", async () => {
  fd = openSync(path, "w");
  const logger = jsonLogger("info", stderrLines(fd));
  logger.log("info", "request", { n: 1 });
  logger.log("info", "request", { n: 2 });
  expect(written()).toBe("");
  await new Promise((resolve) => setImmediate(resolve));
  const lines = written()
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line));
  expect(lines.map((line) => line.n)).toEqual([1, 2]);
});

test("a warning or an error is written at once, after the lines queued before it", () => {
  fd = openSync(path, "w");
  const logger = jsonLogger("info", stderrLines(fd));
  logger.log("info", "request", { n: 1 });
  logger.log("error", "store failed", { n: 2 });
  const lines = written()
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line));
  expect(lines.map((line) => [line.level, line.n])).toEqual([
    ["info", 1],
    ["error", 2],
  ]);
});

test("lines below the level are dropped", async () => {
  fd = openSync(path, "w");
  const logger = jsonLogger("warn", stderrLines(fd));
  logger.log("info", "request");
  await new Promise((resolve) => setImmediate(resolve));
  expect(written()).toBe("");
});

process.on("exit", () => rmSync(dir, { recursive: true, force: true }));

test("a line is the JSON of ts, level, msg and then the fields, whatever the fields hold", () => {
  const lines: string[] = [];
  const logger = jsonLogger("debug", (line) => lines.push(line));
  const cases: [string, Record<string, unknown> | undefined][] = [
    ["request", { request_id: "req_1", status: 200, duration_ms: 0.25 }],
    ['quote " and \\ and \n', { nested: { a: [1, null, "é"] }, gone: undefined, big: 1e21 }],
    ["no fields", undefined],
    ["empty fields", {}],
    ["only undefined", { gone: undefined }],
    ["fields with a toJSON of their own", { toJSON: () => "text", kept: 1 }],
  ];
  for (const [msg, fields] of cases) logger.log("debug", msg, fields);
  fd = openSync(path, "w");
  lines.forEach((line, i) => {
    const [msg, fields] = cases[i] as (typeof cases)[number];
    const parsed = JSON.parse(line);
    expect(line.endsWith("\n")).toBe(true);
    expect(line.slice(0, -1)).toBe(JSON.stringify({ ts: parsed.ts, level: "debug", msg, ...fields }));
    // A toJSON among the fields serialises the whole line, as it did with the spread.
    if (!("toJSON" in (fields ?? {}))) expect(Number.isNaN(Date.parse(parsed.ts))).toBe(false);
  });
});

test("a write that takes part of the lines, or none for a moment, still gets every byte out in order", async () => {
  fd = openSync(path, "w");
  let calls = 0;
  // A pipe whose reader is behind: 7 bytes a write at most, and every third write nothing at all.
  const partial = (target: number, bytes: Uint8Array) => {
    calls++;
    if (calls % 3 === 0)
      throw Object.assign(new Error("EAGAIN: resource temporarily unavailable"), { code: "EAGAIN" });
    return writeSync(target, bytes.subarray(0, 7));
  };
  const logger = jsonLogger("info", stderrLines(fd, partial));
  for (let n = 0; n < 20; n++) logger.log("info", "request", { n, path: "/runtime/v1/heartbeat é" });
  await new Promise((resolve) => setImmediate(resolve));
  const lines = written()
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line));
  expect(lines.map((line) => line.n)).toEqual(Array.from({ length: 20 }, (_, n) => n));
  expect(lines.every((line) => line.path === "/runtime/v1/heartbeat é")).toBe(true);
  expect(calls).toBeGreaterThan(100);
});

test("a closed stderr drops the lines without throwing", () => {
  fd = openSync(path, "w");
  const closed = () => {
    throw Object.assign(new Error("EBADF: bad file descriptor"), { code: "EBADF" });
  };
  const logger = jsonLogger("info", stderrLines(fd, closed));
  expect(() => logger.log("error", "store failed")).not.toThrow();
});

test("a reader that takes nothing holds one flush up at most 100 ms; later flushes drop their lines at once, and the line cut off is ended when it reads again", () => {
  fd = openSync(path, "w"); // closed after each test; this one writes to no file
  const received: string[] = [];
  let reader: "takes 10 bytes" | "stuck" | "reading" = "takes 10 bytes";
  let tries = 0;
  const pipe = (_fd: number, bytes: Uint8Array) => {
    tries++;
    if (reader === "stuck")
      throw Object.assign(new Error("EAGAIN: resource temporarily unavailable"), { code: "EAGAIN" });
    const taken = reader === "takes 10 bytes" ? bytes.subarray(0, 10) : bytes;
    if (reader === "takes 10 bytes") reader = "stuck";
    received.push(new TextDecoder().decode(taken));
    return taken.length;
  };
  const write = stderrLines(99, pipe);
  write("first line, longer than ten bytes\n", true);
  // It waited (1 ms a try) for a reader that took nothing, then gave up.
  expect(tries).toBeGreaterThan(50);
  expect(tries).toBeLessThanOrEqual(102);
  tries = 0;
  write("second line\n", true);
  expect(tries).toBe(1);
  reader = "reading";
  write("third line\n", true);
  expect(received.join("")).toBe("first line\nthird line\n");
});
