import { describe, expect, test } from "bun:test";
import type { DispatcherOptions } from "../../src/jobs/webhook-dispatch-options.ts";
import { CANNOT_RESOLVE, NO_PUBLIC_ADDRESS } from "../../src/modules/webhooks/address.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";
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
      for (const r of hanging) subscribe(r.url(), ["customer.created"]);
      subscribe(receiver.url(), ["customer.created"]);
      for (const name of ["A", "B", "C"]) await customerCreated(name);
      // Retries due at once and attempts cut off after 100 ms: every pass finds work everywhere.
      const d = dispatcher({
        perEndpointConcurrency: 2,
        globalConcurrency: 8,
        timeoutMs: 100,
        retryDelaysSec: [0, 0, 0, 0, 0, 0, 0],
      });
      // Until every hanging receiver has been tried (and failed) once.
      while (hanging.some((r) => r.received.length === 0)) await d.runOnce();
      const counts = () => hanging.map((r) => r.received.length);
      for (const name of ["D", "E"]) await customerCreated(name);
      const healthyBefore = receiver.received.length;
      const before = counts();
      await d.runOnce();
      const tried = counts().map((n, i) => n - (before[i] ?? 0));
      // Half of the eight slots for the failing six, one each; the healthy one's two new events meanwhile.
      expect(tried.reduce((sum, n) => sum + n, 0)).toBe(4);
      expect(Math.max(...tried)).toBe(1);
      expect(receiver.received.length - healthyBefore).toBe(2);
    } finally {
      release();
      for (const r of hanging) r.stop();
    }
  });
});

test("a failing endpoint with a long backlog takes turns with another failing one instead of taking the slot pass after pass", async () => {
  const [long, short] = [new Receiver(), new Receiver()];
  try {
    for (const r of [long, short]) r.behaviour = () => new Response("down", { status: 503 });
    subscribe(long.url(), ["customer.created"]);
    for (let i = 0; i < 10; i++) await customerCreated(`Old ${i}`);
    subscribe(short.url(), ["customer.created"]);
    await customerCreated("New");
    // One slot for failing endpoints; retries due at once.
    const d = dispatcher({ globalConcurrency: 2, retryDelaysSec: [0, 0, 0, 0, 0, 0, 0] });
    while (long.received.length === 0 || short.received.length === 0) await d.runOnce();
    // Both have failed. The long backlog's older deliveries would come first every time; turns
    // give each endpoint the slot in turn.
    const order: string[] = [];
    for (let pass = 0; pass < 4; pass++) {
      const before = [long.received.length, short.received.length];
      await d.runOnce();
      if (long.received.length > (before[0] ?? 0)) order.push("long");
      if (short.received.length > (before[1] ?? 0)) order.push("short");
    }
    expect(order.filter((name) => name === "short")).toHaveLength(2);
    expect(order.filter((name) => name === "long")).toHaveLength(2);
  } finally {
    long.stop();
    short.stop();
  }
});

test("the dispatcher finds due deliveries by index, never by reading every due row or every endpoint ever made (it asks whenever an attempt ends)", async () => {
  const { sql } = await sqlPreparedDuring(t.deps.sqlite, () => dispatcher());
  const reads = sql.filter((text) => /^\s*SELECT[\s\S]*FROM webhook_(deliveries|endpoints)/.test(text));
  expect(reads).toHaveLength(4);
  for (const text of reads) {
    const plan = queryPlan(t.deps.sqlite, text);
    // Stopped endpoints are kept (the API lists them): the active ones are found by their status.
    expect(plan).toMatch(
      /^SEARCH (webhook_deliveries USING (COVERING )?INDEX webhook_deliveries_(endpoint_due|due)|w USING INDEX webhook_endpoints_status) \(/,
    );
    expect(plan).not.toMatch(/\bSCAN\b/);
    expect(plan).not.toContain("TEMP B-TREE FOR ORDER BY");
  }
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
    expect(attempt).toMatchObject({ outcome: "refused", response_status: null, error: NO_PUBLIC_ADDRESS });
    expect(receiver.received).toHaveLength(0);
  });

  test("the delivery log never says what an internal name resolves to: the address goes to the server log at debug only", async () => {
    const lines: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
    const logger = {
      log: (level: string, msg: string, fields?: Record<string, unknown>) =>
        lines.push({ level, msg, fields }),
    };
    const { row } = subscribe(`http://db.corp.internal:${receiver.port}/hook`);
    await customerCreated();
    await dispatcher({
      allowPrivateNetworks: false,
      resolver: async () => ["10.20.30.40"],
      logger,
    }).runOnce();
    const [listed] = await deliveries(row.id);
    const detail = await delivery(row.id, listed?.id as string);
    expect(detail.attempt_log[0]).toMatchObject({ outcome: "refused", error: NO_PUBLIC_ADDRESS });
    expect(listed?.last_error).toBe(NO_PUBLIC_ADDRESS);
    expect(JSON.stringify(detail)).not.toContain("10.20.30.40");
    expect(
      lines.filter((line) => JSON.stringify(line).includes("10.20.30.40")).map((line) => line.level),
    ).toEqual(["debug"]);
  });

  test.each([
    [
      "a name that does not exist",
      () => Promise.reject(new Error("getaddrinfo ENOTFOUND nowhere.corp.internal")),
    ],
    ["a resolver that fails", () => Promise.reject(new Error("queryA ESERVFAIL nowhere.corp.internal"))],
    ["a name with no address", () => Promise.resolve([])],
  ])(
    "the delivery log says the same for %s as for a private answer, without the resolver's words: it cannot tell which internal names exist",
    async (_what, resolver) => {
      const { row } = subscribe(`http://nowhere.corp.internal:${receiver.port}/hook`);
      await customerCreated();
      await dispatcher({ allowPrivateNetworks: false, resolver }).runOnce();
      const [listed] = await deliveries(row.id);
      const detail = await delivery(row.id, listed?.id as string);
      expect(detail.attempt_log[0]).toMatchObject({ outcome: "refused", error: NO_PUBLIC_ADDRESS });
      expect(listed?.last_error).toBe(NO_PUBLIC_ADDRESS);
    },
  );

  test("where private networks are allowed, a name that does not resolve is said so", async () => {
    const { row } = subscribe(`http://nowhere.corp.internal:${receiver.port}/hook`);
    await customerCreated();
    await dispatcher({
      allowPrivateNetworks: true,
      resolver: () => Promise.reject(new Error("getaddrinfo ENOTFOUND nowhere.corp.internal")),
    }).runOnce();
    const [listed] = await deliveries(row.id);
    expect(listed?.last_error).toBe(CANNOT_RESOLVE);
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
