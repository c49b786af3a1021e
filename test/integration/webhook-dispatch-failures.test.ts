import { describe, expect, test } from "bun:test";
import type { LogLevel } from "../../src/http/logger.ts";
import {
  customerCreated,
  deliveries,
  dispatcher,
  receiver,
  subscribe,
  t,
  useWebhookDeliveryContext,
} from "../support/webhook-receiver.ts";

/**
 * A full disk fails every claim of the webhook dispatcher, and it wakes up on every queued event
 * and every second: each failure logged at error level made hundreds of lines in seconds. The store
 * here refuses the claims as a full disk does (a trigger that raises SQLite's message for it).
 */
useWebhookDeliveryContext();

const FULL_DISK = "database or disk is full";
const refuseClaims = () =>
  t.deps.sqlite.run(
    `CREATE TEMP TRIGGER full_disk BEFORE UPDATE ON webhook_deliveries
     BEGIN SELECT RAISE(ABORT, '${FULL_DISK}'); END`,
  );

function failingDispatcher() {
  const lines: { level: LogLevel; msg: string; fields: Record<string, unknown> }[] = [];
  let nowMs = 0;
  const d = dispatcher({
    logger: { log: (level, msg, fields = {}) => lines.push({ level, msg, fields }) },
    monotonicMs: () => nowMs,
  });
  const passAt = (ms: number) => {
    nowMs = ms;
    d.dispatchPass();
  };
  const dispatchLines = () => lines.filter((line) => line.msg.startsWith("webhook dispatch"));
  return { d, passAt, dispatchLines };
}

describe("a dispatch pass that fails on every wake-up", () => {
  test("is logged at once, then once a minute with how many were not logged, and its recovery once", async () => {
    const { row } = subscribe();
    await customerCreated();
    refuseClaims();
    const { d, passAt, dispatchLines } = failingDispatcher();

    for (let ms = 0; ms < 60_000; ms += 100) passAt(ms);
    expect(dispatchLines()).toEqual([
      { level: "error", msg: "webhook dispatch failed", fields: { error: FULL_DISK, suppressed: 0 } },
    ]);

    passAt(60_000);
    passAt(60_500);
    passAt(61_000);
    expect(dispatchLines().slice(1)).toEqual([
      { level: "error", msg: "webhook dispatch failed", fields: { error: FULL_DISK, suppressed: 599 } },
    ]);

    t.deps.sqlite.run("DROP TRIGGER full_disk");
    passAt(61_500);
    await d.idle();
    passAt(62_000);
    expect(dispatchLines().slice(2)).toEqual([
      { level: "info", msg: "webhook dispatch recovered", fields: { suppressed: 2 } },
    ]);
    // Nothing was lost while the claims failed: the delivery went out once the disk had room.
    expect(receiver.received).toHaveLength(1);
    expect((await deliveries(row.id)).map((x) => x.status)).toEqual(["succeeded"]);
  });

  test("fails again after a recovery without a line until a minute has passed since the last failure's", async () => {
    subscribe();
    await customerCreated();
    refuseClaims();
    const { d, passAt, dispatchLines } = failingDispatcher();
    passAt(0);
    t.deps.sqlite.run("DROP TRIGGER full_disk");
    passAt(1_000);
    await d.idle();
    await customerCreated("Grace");
    refuseClaims();
    passAt(2_000);
    passAt(3_000);
    expect(dispatchLines().map((line) => [line.msg, line.fields.suppressed])).toEqual([
      ["webhook dispatch failed", 0],
      ["webhook dispatch recovered", 0],
    ]);
    passAt(60_000);
    expect(dispatchLines().slice(2)).toEqual([
      { level: "error", msg: "webhook dispatch failed", fields: { error: FULL_DISK, suppressed: 2 } },
    ]);
  });
});
