import { expect, test } from "bun:test";
import { RepeatedFailureLog } from "../../src/jobs/repeated-failure-log.ts";

const logOf = () => {
  const lines: string[] = [];
  let nowMs = 0;
  const log = new RepeatedFailureLog(
    { log: (level, msg, fields) => lines.push(`${level} ${msg} ${JSON.stringify(fields)}`) },
    { failed: "step failed", recovered: "step recovered", nowMs: () => nowMs },
  );
  return {
    lines,
    log,
    at: (ms: number) => {
      nowMs = ms;
    },
  };
};

test("a step that flaps between failing and working every pass is logged at most twice a minute", () => {
  const { lines, log, at } = logOf();
  for (let ms = 0; ms < 180_000; ms += 100) {
    at(ms);
    if ((ms / 100) % 2 === 0) log.failed(new Error("disk I/O error"));
    else log.succeeded();
  }
  expect(lines).toEqual([
    'error step failed {"error":"disk I/O error","suppressed":0}',
    'info step recovered {"suppressed":0}',
    'error step failed {"error":"disk I/O error","suppressed":299}',
    'info step recovered {"suppressed":0}',
    'error step failed {"error":"disk I/O error","suppressed":299}',
    'info step recovered {"suppressed":0}',
  ]);
});

test("a step that never failed, or recovered already, logs nothing when it works", () => {
  const { lines, log, at } = logOf();
  log.succeeded();
  expect(lines).toEqual([]);
  log.failed("not an Error");
  at(10);
  log.succeeded();
  log.succeeded();
  expect(lines).toEqual([
    'error step failed {"error":"not an Error","suppressed":0}',
    'info step recovered {"suppressed":0}',
  ]);
});
