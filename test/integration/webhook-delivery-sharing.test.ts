import { describe, expect, test } from "bun:test";
import { enqueueEvent, onEnqueue } from "../../src/modules/webhooks/enqueue.ts";
import { recordStatementRuns } from "../support/query-plan.ts";
import {
  ctx,
  customerCreated,
  dispatcher,
  endpoints,
  Receiver,
  receiver,
  subscribe,
  t,
  useWebhookDeliveryContext,
} from "../support/webhook-receiver.ts";

/**
 * What a dispatch pass costs and who gets the attempts in flight, against real HTTP receivers on
 * 127.0.0.1: a pass reads only what can be sent (never the endpoints stopped or disabled over the
 * years), events queued together wake it once, and receivers that answer slowly, even with a 2xx,
 * cannot hold the pool against quick ones. Receivers are held and released by promises, not timed.
 */
useWebhookDeliveryContext();

/** Deliveries claimed (in flight) per endpoint: a pass claims before it returns. */
function inFlight(): Map<string, number> {
  const rows = t.deps.sqlite
    .query<{ endpoint_id: string; n: number }, []>(
      "SELECT endpoint_id, count(*) AS n FROM webhook_deliveries WHERE status = 'delivering' GROUP BY endpoint_id",
    )
    .all();
  return new Map(rows.map((row) => [row.endpoint_id, row.n]));
}

function gate(): { wait: Promise<void>; open: () => void } {
  let open: () => void = () => {};
  const wait = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { wait, open };
}

describe("the cost of a dispatch pass", () => {
  test("stopped and disabled endpoints are never read: a pass runs the same statements, returning the same rows, with none or hundreds", async () => {
    subscribe(receiver.url(), ["customer.created"]);
    // Every statement of a pass with nothing due; the dispatcher prepares its statements when it
    // is made, so it is made while recording.
    const measure = async () => {
      const recording = recordStatementRuns(t.deps.sqlite);
      try {
        const d = dispatcher();
        recording.runs.length = 0;
        expect(await d.runOnce()).toBe(0);
      } finally {
        recording.stop();
      }
      return recording.runs;
    };
    const before = await measure();
    // Years of endpoints made and deleted, and some a 410 disabled.
    const service = endpoints();
    for (let i = 0; i < 300; i++) {
      const { row } = service.create({ url: receiver.url(`/old/${i}`), events: ["customer.created"] }, ctx);
      service.stop(row.id, undefined, ctx);
    }
    for (let i = 0; i < 20; i++) {
      const { row } = service.create({ url: receiver.url(`/gone/${i}`), events: ["customer.created"] }, ctx);
      t.deps.sqlite.run(
        "UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = 'gone' WHERE id = ?",
        [row.id],
      );
    }
    const after = await measure();
    expect(after.length).toBeGreaterThan(0);
    expect(after).toEqual(before);
    // The one active endpoint still gets its event.
    await customerCreated();
    expect(await dispatcher().runOnce()).toBe(1);
    expect(receiver.received.map((r) => r.path)).toEqual(["/hook"]);
  });

  test("events queued in one turn of the event loop wake the dispatcher once, not once each", async () => {
    subscribe(receiver.url(), ["customer.created"]);
    let kicks = 0;
    const unsubscribe = onEnqueue(t.deps.sqlite, () => kicks++);
    try {
      for (let i = 0; i < 50; i++) {
        enqueueEvent(t.deps, "customer.created", {
          environment: "live",
          target: { type: "customer", id: `cus_${i}` },
        });
      }
      expect(kicks).toBe(0);
      // A timer set after the enqueues runs after theirs.
      await new Promise((resolve) => setTimeout(resolve, 0));
      expect(kicks).toBe(1);
      enqueueEvent(t.deps, "customer.created", {
        environment: "live",
        target: { type: "customer", id: "cus_x" },
      });
      await new Promise((resolve) => setTimeout(resolve, 0));
      expect(kicks).toBe(2);
    } finally {
      unsubscribe();
    }
  });
});

describe("receivers that answer slowly", () => {
  test("slow endpoints the process has not yet seen be slow leave a slot for a quick one, which gets every delivery while they hang", async () => {
    const slow = Array.from({ length: 8 }, () => new Receiver());
    const held = gate();
    try {
      for (const r of slow) {
        r.behaviour = async () => {
          await held.wait;
          return new Response("ok");
        };
        subscribe(r.url(), ["customer.created"]);
      }
      // The slow ones have waited longest: by age alone they would take every slot.
      await customerCreated("A");
      const quick = subscribe(receiver.url(), ["customer.created"]);
      for (const name of ["B", "C", "D", "E"]) await customerCreated(name);
      const d = dispatcher({ perEndpointConcurrency: 2, globalConcurrency: 16 });
      const first = d.runOnce();
      const claimed = inFlight();
      expect(claimed.get(quick.row.id)).toBe(1);
      expect([...claimed.values()].reduce((sum, n) => sum + n, 0)).toBe(16);
      // Its slot comes back as each attempt ends, before any slow endpoint's second one.
      while (receiver.received.length < 4) {
        if ((await d.runOnce()) === 0) await Bun.sleep(5);
      }
      expect(slow.every((r) => r.inFlight > 0)).toBe(true);
      expect(slow.reduce((sum, r) => sum + r.received.length, 0)).toBeLessThanOrEqual(15);
      held.open();
      await first;
    } finally {
      held.open();
      for (const r of slow) r.stop();
    }
  });

  test("an endpoint whose 2xx came slowly gets one attempt at a time, half the pool with the others, until it answers quickly again", async () => {
    const slow = Array.from({ length: 6 }, () => new Receiver());
    let elapsed = 0;
    let phase: "slow" | "held" | "quick" = "slow";
    const held = gate();
    try {
      const slowIds = new Set<string>();
      for (const r of slow) {
        r.behaviour = async () => {
          // A 200 after 8 s, as the attempt's timer sees it.
          if (phase === "slow") elapsed += 8_000;
          if (phase === "held") await held.wait;
          return new Response("ok");
        };
        slowIds.add(subscribe(r.url(), ["customer.created"]).row.id);
      }
      const d = dispatcher({ perEndpointConcurrency: 2, globalConcurrency: 8, monotonicMs: () => elapsed });
      await customerCreated("A");
      expect(await d.runOnce()).toBe(6);
      // Every one succeeded, slowly.
      expect(slow.every((r) => r.received.length === 1)).toBe(true);
      const quick = subscribe(receiver.url(), ["customer.created"]);
      phase = "held";
      for (const name of ["B", "C", "D"]) await customerCreated(name);
      const pass = d.runOnce();
      const claimed = inFlight();
      const slowClaimed = [...claimed].filter(([id]) => slowIds.has(id)).map(([, n]) => n);
      expect(slowClaimed.reduce((sum, n) => sum + n, 0)).toBe(4);
      expect(Math.max(...slowClaimed)).toBe(1);
      expect(claimed.get(quick.row.id)).toBe(2);
      // Answering quickly again lifts the limit.
      phase = "quick";
      held.open();
      await pass;
      await d.idle();
      while ((await d.runOnce()) > 0);
      for (const name of ["E", "F"]) await customerCreated(name);
      const next = d.runOnce();
      const again = [...inFlight()].filter(([id]) => slowIds.has(id)).map(([, n]) => n);
      expect(again.reduce((sum, n) => sum + n, 0)).toBeGreaterThan(4);
      await next;
    } finally {
      held.open();
      for (const r of slow) r.stop();
    }
  });
});

describe("what a dispatcher remembers of endpoints", () => {
  test("is let go once an endpoint no longer receives, so a long-lived process does not keep every endpoint it ever tried", async () => {
    const kept = subscribe();
    const stopped = [subscribe(), subscribe()];
    await customerCreated();
    const d = dispatcher();
    await d.runOnce();
    expect(d.trackedEndpointCount).toBe(3);
    for (const { row } of stopped)
      expect((await t.call("DELETE", `/mgmt/v1/webhooks/${row.id}`)).status).toBe(204);
    await customerCreated("Grace");
    await d.runOnce();
    expect(d.trackedEndpointCount).toBe(1);
    // The endpoint still active goes on receiving: three deliveries of the first event, one of the second.
    expect(receiver.received).toHaveLength(4);
    expect((await t.call("GET", `/mgmt/v1/webhooks/${kept.row.id}/deliveries`)).body.data).toHaveLength(2);
  });
});
