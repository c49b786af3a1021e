import { afterEach, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
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
