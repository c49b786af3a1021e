import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readServerLog, slowAfter, stealTicksOf } from "../bench/lib/tail.ts";

describe("slowAfter (bench: which stall a slow request followed)", () => {
  test("a request counts when it completed between 30 ms before and 120 ms after an event", () => {
    const events = [10_000];
    const slow = [9_969, 9_970, 10_000, 10_120, 10_121];
    expect(slowAfter(slow, events).near).toBe(3);
  });

  test("each request counts once however many events precede it", () => {
    const events = [1_000, 1_050, 1_100];
    expect(slowAfter([1_110], events).near).toBe(1);
  });

  test("events need not come sorted", () => {
    const events = [5_000, 1_000, 3_000];
    expect(slowAfter([1_050, 3_050, 5_050, 7_000], events).near).toBe(3);
  });

  test("the chance count moves every event by 500 ms", () => {
    const events = [1_000, 2_000];
    // Right after the events: near, not chance; 500 ms later: chance, not near.
    expect(slowAfter([1_010, 2_010], events)).toEqual({ near: 2, chance: 0 });
    expect(slowAfter([1_510, 2_510], events)).toEqual({ near: 0, chance: 2 });
  });

  test("no events explain nothing", () => {
    expect(slowAfter([1, 2, 3], [])).toEqual({ near: 0, chance: 0 });
  });
});

describe("readServerLog (bench: request and WAL-restart lines of a server log)", () => {
  const dir = mkdtempSync(join(tmpdir(), "bench-tail-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test("durations are sorted, slow requests keep their completion time, restarts are read", () => {
    const log = join(dir, "serve.log");
    writeFileSync(
      log,
      [
        '{"ts":"2026-11-23T08:00:00.100Z","level":"info","msg":"request","duration_ms":12.5}',
        '{"ts":"2026-11-23T08:00:00.200Z","level":"info","msg":"request","duration_ms":0.3}',
        "[GC<0x1>: START M 1000kb => EdenCollection]",
        '{"ts":"2026-11-23T08:00:00.300Z","level":"debug","msg":"wal restart","writes_held_ms":2.5,"checkpoint_ms":2.4,"caught_up":true}',
        '{"ts":"2026-11-23T08:00:00.400Z","level":"info","msg":"request","duration_ms":10}',
        '{"ts":"2026-11-23T08:00:00.500Z","level":"info","msg":"requ',
      ].join("\n"),
    );
    const extract = readServerLog(log);
    expect(extract.durations).toEqual([0.3, 10, 12.5]);
    // Over 10 ms only: exactly 10 is not slow.
    expect(extract.slowAt).toEqual([Date.parse("2026-11-23T08:00:00.100Z")]);
    expect(extract.restarts).toEqual([
      { at: Date.parse("2026-11-23T08:00:00.300Z"), writesHeldMs: 2.5, caughtUp: true },
    ]);
  });

  test("reading from a byte offset skips what came before", () => {
    const log = join(dir, "offset.log");
    const first = '{"ts":"2026-11-23T08:00:00.100Z","level":"info","msg":"request","duration_ms":50}\n';
    writeFileSync(
      log,
      `${first}{"ts":"2026-11-23T08:00:01.000Z","level":"info","msg":"request","duration_ms":1}\n`,
    );
    expect(readServerLog(log, Buffer.byteLength(first)).durations).toEqual([1]);
  });
});

describe("stealTicksOf (bench: steal time of one CPU from /proc/stat)", () => {
  // Fields: user nice system idle iowait irq softirq steal guest guest_nice, each value distinct.
  const procStat = [
    "cpu  100 2 30 4000 5 0 60 77 0 0",
    "cpu1 11 1 12 1300 2 0 13 14 15 16",
    "cpu10 21 1 22 2300 2 0 23 24 25 26",
    "intr 12345",
  ].join("\n");

  test("the steal value is the 8th after the CPU's name, not softirq or guest", () => {
    expect(stealTicksOf(procStat, 1)).toBe(14);
  });

  test("cpu1 does not match the line of cpu10", () => {
    expect(stealTicksOf(procStat, 10)).toBe(24);
  });

  test("a CPU without a line has no steal figure, not zero", () => {
    expect(stealTicksOf(procStat, 2)).toBeUndefined();
  });
});
