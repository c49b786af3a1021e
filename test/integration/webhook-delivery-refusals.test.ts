import { describe, expect, test } from "bun:test";
import type { DispatcherOptions } from "../../src/jobs/webhook-dispatcher.ts";
import {
  customerCreated,
  deliveries,
  delivery,
  dispatcher,
  type Received,
  Receiver,
  receiver,
  subscribe,
  t,
  useWebhookDeliveryContext,
  verify,
} from "../support/webhook-receiver.ts";

/**
 * What the webhook dispatcher refuses, against a real HTTP receiver on 127.0.0.1: receivers that
 * answer 410, redirect or time out, a slow receiver taking more than its share, and addresses the
 * outbound check does not allow (loopback, private and metadata answers when private networks are
 * off).
 */
useWebhookDeliveryContext();

describe("what the dispatcher refuses to do", () => {
  test("a 410 from the receiver disables the endpoint and cancels what was queued for it", async () => {
    const { row } = subscribe();
    receiver.behaviour = () => new Response("gone", { status: 410 });
    await customerCreated("A");
    await customerCreated("B");
    expect(await dispatcher({ perEndpointConcurrency: 1 }).runOnce()).toBe(1);
    const endpoint = await t.call("GET", `/mgmt/v1/webhooks/${row.id}`);
    expect(endpoint.body.data).toMatchObject({ status: "disabled", disabled_reason: "gone" });
    const log = await deliveries(row.id);
    expect(log.map((d) => d.status).sort()).toEqual(["cancelled", "failed"]);
    await customerCreated("C");
    t.clock.advance(86_400);
    expect(await dispatcher().runOnce()).toBe(0);
    expect(receiver.received).toHaveLength(1);
  });

  test("a redirect is not followed and counts as a failure", async () => {
    const { row } = subscribe();
    receiver.behaviour = (request) =>
      new URL(request.url).pathname === "/hook"
        ? new Response(null, { status: 307, headers: { location: receiver.url("/elsewhere") } })
        : new Response("ok");
    await customerCreated();
    await dispatcher().runOnce();
    expect(receiver.received.map((r) => r.path)).toEqual(["/hook"]);
    expect((await deliveries(row.id))[0]).toMatchObject({
      status: "pending",
      last_response_status: 307,
      last_error: "redirect not followed",
    });
  });

  test("an attempt that gets no answer within the timeout fails and is retried", async () => {
    const { row } = subscribe();
    receiver.behaviour = async () => {
      await Bun.sleep(1_000);
      return new Response("too late");
    };
    await customerCreated();
    const started = performance.now();
    await dispatcher({ timeoutMs: 150 }).runOnce();
    expect(performance.now() - started).toBeLessThan(900);
    expect((await deliveries(row.id))[0]).toMatchObject({
      status: "pending",
      last_response_status: null,
      last_error: "no answer within 150 ms",
    });
  });

  test("a 2xx whose body is still coming when the timeout passes is a success, not an attempt to repeat", async () => {
    const { row } = subscribe();
    receiver.behaviour = () =>
      new Response(
        new ReadableStream({
          async start(controller) {
            controller.enqueue(new TextEncoder().encode("ok"));
            await Bun.sleep(1_000);
            controller.close();
          },
        }),
        { status: 200 },
      );
    await customerCreated();
    await dispatcher({ timeoutMs: 150 }).runOnce();
    expect((await deliveries(row.id))[0]).toMatchObject({ status: "succeeded", last_response_status: 200 });
    expect(receiver.received).toHaveLength(1);
  });

  test("a host name that does not resolve in time fails the attempt at its timeout", async () => {
    const { row } = subscribe(`http://slow-dns.example:${receiver.port}/hook`);
    await customerCreated();
    await dispatcher({ timeoutMs: 100, resolver: () => new Promise<string[]>(() => {}) }).runOnce();
    expect((await deliveries(row.id))[0]).toMatchObject({
      status: "pending",
      last_response_status: null,
      last_error: "no answer within 100 ms",
    });
    expect(receiver.received).toHaveLength(0);
  });

  test("a process never claims again a delivery its own attempt is still making, however far its clock moves", async () => {
    subscribe(`http://receiver.internal:${receiver.port}/hook`);
    await customerCreated();
    let resolveFirst: (answers: string[]) => void = () => {};
    let lookups = 0;
    const d = dispatcher({
      resolver: () => {
        lookups++;
        if (lookups > 1) return Promise.resolve(["127.0.0.1"]);
        return new Promise<string[]>((resolve) => {
          resolveFirst = resolve;
        });
      },
    });
    const first = d.runOnce();
    while (lookups === 0) await Bun.sleep(5);
    t.clock.advance(3600);
    expect(await d.runOnce()).toBe(0);
    resolveFirst(["127.0.0.1"]);
    expect(await first).toBe(1);
    expect(receiver.received).toHaveLength(1);
  });

  test("one slow receiver holds at most its own concurrency limit and does not delay another endpoint", async () => {
    const slow = new Receiver();
    try {
      let releaseSlow: () => void = () => {};
      const gate = new Promise<void>((resolve) => {
        releaseSlow = resolve;
      });
      slow.behaviour = async () => {
        await gate;
        return new Response("ok");
      };
      subscribe(slow.url(), ["customer.created"]);
      const fast = subscribe(receiver.url(), ["customer.created"]);
      for (const name of ["A", "B", "C", "D", "E"]) await customerCreated(name);
      const d = dispatcher({ perEndpointConcurrency: 2 });
      const first = d.runOnce();
      // The fast endpoint gets its first two while the slow one hangs.
      while (receiver.received.length < 2 || slow.inFlight < 2) await Bun.sleep(5);
      expect(slow.inFlight).toBe(2);
      // Both fast attempts recorded, and one more turn for their slots to be given back (a fixed
      // sleep here was too short on a loaded machine).
      const succeeded = async () =>
        (await deliveries(fast.row.id)).filter((x) => x.status === "succeeded").length;
      while ((await succeeded()) < 2) await Bun.sleep(5);
      await Bun.sleep(0);
      // A second pass while the slow endpoint is full claims only for the fast one.
      const second = d.runOnce();
      while (receiver.received.length < 4) await Bun.sleep(5);
      expect(slow.maxInFlight).toBe(2);
      releaseSlow();
      await Promise.all([first, second]);
      await d.idle();
      while ((await d.runOnce()) > 0);
      expect(receiver.received).toHaveLength(5);
      expect(slow.received).toHaveLength(5);
      expect(slow.maxInFlight).toBe(2);
      expect((await deliveries(fast.row.id)).every((x) => x.status === "succeeded")).toBe(true);
    } finally {
      slow.stop();
    }
  });
});

describe("sharing the attempts in flight", () => {
  test("a receiver that answers at once gets every queued delivery as slots come back, not one pair per poll", async () => {
    subscribe(receiver.url(), ["customer.created"]);
    for (let i = 0; i < 12; i++) await customerCreated(`C${i}`);
    // The poll never comes round during the test: only slots given back can move the queue.
    const stop = dispatcher({
      perEndpointConcurrency: 2,
      pollMs: 3_600_000,
      expiryScanMs: 3_600_000,
    }).start();
    try {
      while (receiver.received.length < 12) await Bun.sleep(5);
      expect(receiver.maxInFlight).toBeLessThanOrEqual(2);
    } finally {
      await stop();
    }
  });

  test("receivers that keep failing get one attempt each and half the pool together, so a healthy one is not held up", async () => {
    const hanging = Array.from({ length: 6 }, () => new Receiver());
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    try {
      for (const r of hanging) {
        r.behaviour = async () => {
          await gate;
          return new Response("ok");
        };
      }
      const failing = hanging.map((r) => subscribe(r.url(), ["customer.created"]).row.id);
      const healthy = subscribe(receiver.url(), ["customer.created"]);
      for (const name of ["A", "B", "C"]) await customerCreated(name);
      // What an earlier process left: each hanging endpoint failed its first attempt, and the
      // retry is due now; the healthy endpoint's deliveries are due too.
      const placeholders = failing.map(() => "?").join(",");
      t.deps.sqlite
        .query(`UPDATE webhook_deliveries SET attempts = 1 WHERE endpoint_id IN (${placeholders})`)
        .run(...failing);
      const d = dispatcher({ perEndpointConcurrency: 2, globalConcurrency: 4 });
      const pass = d.runOnce();
      // Two of the four slots go to the failing endpoints (one each), two to the healthy one.
      while (receiver.received.length < 2) await Bun.sleep(5);
      await Bun.sleep(50);
      const hangingInFlight = hanging.map((r) => r.inFlight);
      expect(hangingInFlight.reduce((a, b) => a + b, 0)).toBe(2);
      expect(Math.max(...hangingInFlight)).toBe(1);
      expect(receiver.received).toHaveLength(2);
      release();
      await pass;
      await d.idle();
      while ((await d.runOnce()) > 0);
      expect((await deliveries(healthy.row.id)).map((x) => x.status)).toEqual([
        "succeeded",
        "succeeded",
        "succeeded",
      ]);
    } finally {
      release();
      for (const r of hanging) r.stop();
    }
  });
});

describe("the outbound address check", () => {
  const refusedBy = async (url: string, options: Partial<DispatcherOptions>) => {
    const { row } = subscribe(url);
    await customerCreated();
    await dispatcher({ allowPrivateNetworks: false, ...options }).runOnce();
    const detail = await delivery(row.id, ((await deliveries(row.id))[0] as { id: string }).id);
    return detail.attempt_log[0];
  };

  test("refuses the loopback receiver when private networks are not allowed, and sends nothing", async () => {
    const attempt = await refusedBy(receiver.url(), {});
    expect(attempt).toMatchObject({ outcome: "refused", response_status: null });
    expect(attempt.error).toContain("127.0.0.1");
    expect(receiver.received).toHaveLength(0);
  });

  test.each([
    ["a private IPv4 answer", ["10.1.2.3"]],
    ["the metadata address", ["169.254.169.254"]],
    ["an IPv4-mapped loopback", ["::ffff:127.0.0.1"]],
    ["a unique-local IPv6 answer", ["fd12:3456::1"]],
    ["a link-local IPv6 answer", ["fe80::1"]],
    ["one private answer among public ones", ["93.184.216.34", "192.168.1.5"]],
    ["no answer at all", []],
  ])("refuses a host name that resolves to %s", async (_what, answers) => {
    const attempt = await refusedBy(`http://internal.example:${receiver.port}/hook`, {
      resolver: async () => answers,
    });
    expect(attempt.outcome).toBe("refused");
    expect(receiver.received).toHaveLength(0);
  });

  test("an http endpoint made while private networks were allowed gets nothing once they are not", async () => {
    const attempt = await refusedBy("http://receiver.example.com/hook", {
      connectOverride: () => `http://127.0.0.1:${receiver.port}`,
    });
    expect(attempt).toMatchObject({ outcome: "refused", response_status: null });
    expect(attempt.error).toContain("must use https");
    expect(receiver.received).toHaveLength(0);
  });

  test("when the first address refuses the connection, the next one checked gets the delivery", async () => {
    const { secret } = subscribe(`http://receiver.internal:${receiver.port}/hook`);
    await customerCreated();
    // The receiver listens on 127.0.0.1 only: ::1 refuses (or cannot be reached), as a host with a
    // broken IPv6 route would.
    await dispatcher({ resolver: async () => ["::1", "127.0.0.1"] }).runOnce();
    expect(receiver.received).toHaveLength(1);
    verify(secret as string, receiver.received[0] as Received);
  });

  test("with private networks allowed, connects to the address it checked and sends the original Host", async () => {
    const { secret } = subscribe(`http://receiver.internal:${receiver.port}/hook`);
    let lookups = 0;
    await customerCreated();
    await dispatcher({
      resolver: async (host) => {
        lookups++;
        expect(host).toBe("receiver.internal");
        return ["127.0.0.1"];
      },
    }).runOnce();
    expect(lookups).toBe(1);
    const got = receiver.received[0] as Received;
    expect(got.headers.host).toBe(`receiver.internal:${receiver.port}`);
    verify(secret as string, got);
  });
});
