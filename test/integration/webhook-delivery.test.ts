import { describe, expect, test } from "bun:test";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import type { Deps } from "../../src/deps.ts";
import { IdGenerator } from "../../src/domain/ids.ts";
import { silentLogger } from "../../src/http/logger.ts";
import { sweepOnce } from "../../src/jobs/sweeper.ts";
import { RETRY_JITTER, WEBHOOK_RETRY_DELAYS_SEC } from "../../src/jobs/webhook-dispatcher.ts";
import { createServices } from "../../src/services.ts";
import { openStore } from "../../src/store/db.ts";
import {
  ctx,
  customerCreated,
  deliveries,
  delivery,
  dispatcher,
  endpoints,
  type Received,
  receiver,
  subscribe,
  t,
  useWebhookDeliveryContext,
  verify,
} from "../support/webhook-receiver.ts";

/**
 * Webhook delivery against a real HTTP receiver on 127.0.0.1 (Bun.serve): what a delivery carries
 * and where it goes, and how failed attempts are retried. Every request the receiver gets is
 * verified with the `standardwebhooks` package, the reference implementation receivers use. Time
 * for the retry schedule comes from the test clock; the signature timestamp is real time, as
 * receivers check it against their own clock. What the dispatcher refuses is in
 * webhook-delivery-refusals.test.ts; https, secret rotation, team-chat and replay in
 * webhook-delivery-destinations.test.ts.
 */
useWebhookDeliveryContext();

describe("a delivery", () => {
  test("is signed per Standard Webhooks and carries { type, timestamp, environment, data }", async () => {
    const { row, secret } = subscribe();
    const customerId = await customerCreated();
    expect(await dispatcher().runOnce()).toBe(1);
    expect(receiver.received).toHaveLength(1);
    const got = receiver.received[0] as Received;
    const payload = verify(secret as string, got);
    expect(payload).toMatchObject({
      type: "customer.created",
      environment: "live",
      data: {
        type: "customer.created",
        target: { type: "customer", id: customerId, environment: "live" },
        actor: { type: "api_key", name: "live key" },
      },
    });
    expect(Date.parse(payload.timestamp as string)).not.toBeNaN();
    expect(Object.keys(payload).sort()).toEqual(["data", "environment", "timestamp", "type"]);
    expect(got.headers["webhook-id"]).toMatch(/^msg_[0-9A-HJKMNP-TV-Z]{26}$/);
    expect(got.headers["content-type"]).toBe("application/json");
    expect(Math.abs(Number(got.headers["webhook-timestamp"]) - Date.now() / 1000)).toBeLessThan(5);
    // Another secret does not verify it: the check above can fail.
    expect(() => verify(endpoints().create({ url: receiver.url() }, ctx).secret as string, got)).toThrow();
    const log = await deliveries(row.id);
    expect(log).toHaveLength(1);
    expect(log[0]).toMatchObject({ status: "succeeded", attempts: 1, message_id: got.headers["webhook-id"] });
    const detail = await delivery(row.id, log[0]?.id as string);
    expect(detail.payload).toEqual(payload);
    expect(detail.attempt_log).toMatchObject([{ number: 1, outcome: "succeeded", response_status: 200 }]);
  });

  test("of several events to one endpoint goes out in the order they happened", async () => {
    subscribe();
    const ids = [await customerCreated("A"), await customerCreated("B"), await customerCreated("C")];
    const d = dispatcher({ perEndpointConcurrency: 1 });
    while ((await d.runOnce()) > 0);
    const order = receiver.received.map((r) => JSON.parse(r.body).data.target.id as string);
    expect(order).toEqual(ids);
  });

  test("only goes to endpoints subscribed to its type, and * gets everything", async () => {
    subscribe(receiver.url("/licenses"), ["license.created"]);
    const wildcard = subscribe(receiver.url("/all"), ["*"]);
    await customerCreated();
    const d = dispatcher({ perEndpointConcurrency: 1 });
    while ((await d.runOnce()) > 0);
    expect(receiver.received.map((r) => r.path)).toEqual(["/all", "/all"]);
    // Its own creation is an audit event too, and "*" includes it.
    expect(receiver.received.map((r) => verify(wildcard.secret as string, r).type)).toEqual([
      "webhook.created",
      "customer.created",
    ]);
  });
});

describe("retries", () => {
  test("a failing receiver is retried on the schedule with the same webhook-id until it recovers", async () => {
    const { row, secret } = subscribe();
    // The clock stands still except while the first attempt is in flight, when it moves 2 s: the
    // retry must be due 5 s after the attempt ended, not after it began.
    t.clock.freeze();
    receiver.behaviour = (_r, n) => {
      if (n === 1) t.clock.advance(2);
      return new Response("down", { status: n <= 2 ? 503 : 204 });
    };
    await customerCreated();
    const d = dispatcher();
    expect(await d.runOnce()).toBe(1);
    const [first] = await deliveries(row.id);
    expect(first).toMatchObject({
      status: "pending",
      attempts: 1,
      last_response_status: 503,
      last_error: "HTTP 503",
    });
    const attempt = (await delivery(row.id, first?.id as string)).attempt_log[0];
    const gap = Date.parse(first?.next_attempt_at as string) - Date.parse(attempt.started_at);
    expect(gap).toBe(2_000 + 5_000);
    // Not due yet: nothing is sent.
    expect(await d.runOnce()).toBe(0);
    t.clock.advance(5);
    expect(await d.runOnce()).toBe(1);
    t.clock.advance(299);
    expect(await d.runOnce()).toBe(0);
    t.clock.advance(1);
    expect(await d.runOnce()).toBe(1);
    expect(receiver.received).toHaveLength(3);
    const ids = new Set(receiver.received.map((r) => r.headers["webhook-id"]));
    expect(ids.size).toBe(1);
    // Every attempt verifies, each with its own timestamp.
    for (const got of receiver.received) expect(verify(secret as string, got).type).toBe("customer.created");
    const detail = await delivery(row.id, first?.id as string);
    expect(detail.status).toBe("succeeded");
    expect(
      detail.attempt_log.map((a: { number: number; outcome: string; response_status: number }) => [
        a.number,
        a.outcome,
        a.response_status,
      ]),
    ).toEqual([
      [1, "failed", 503],
      [2, "failed", 503],
      [3, "succeeded", 204],
    ]);
    const started = detail.attempt_log.map((a: { started_at: string }) => Date.parse(a.started_at));
    expect(started).toEqual([...started].sort((a, b) => a - b));
  });

  test("delays carry up to 10% jitter either way, and the delivery fails after the last retry", async () => {
    const { row } = subscribe();
    receiver.behaviour = () => new Response("no", { status: 500 });
    await customerCreated();
    // Held still, so the time an attempt takes cannot add to the gap it schedules (CI once saw a
    // 5 s retry land more than 7 ms late on a slow machine).
    t.clock.freeze();
    let low = true;
    const d = dispatcher({ random: () => (low ? 0 : 0.999_999) });
    const gaps: number[] = [];
    for (let i = 0; i <= WEBHOOK_RETRY_DELAYS_SEC.length; i++) {
      expect(await d.runOnce()).toBe(1);
      const [current] = await deliveries(row.id);
      if (current?.status === "failed") break;
      const detail = await delivery(row.id, current?.id as string);
      const last = detail.attempt_log.at(-1);
      gaps.push(Date.parse(current?.next_attempt_at as string) - Date.parse(last.started_at));
      t.clock.advance(Math.ceil(gaps.at(-1) as number) / 1000 + 1);
      low = !low;
    }
    expect(gaps).toHaveLength(WEBHOOK_RETRY_DELAYS_SEC.length);
    gaps.forEach((gap, i) => {
      const base = (WEBHOOK_RETRY_DELAYS_SEC[i] as number) * 1000;
      const expected = i % 2 === 0 ? base * (1 - RETRY_JITTER) : base * (1 + RETRY_JITTER);
      expect(Math.abs(gap - expected)).toBeLessThan(base * 0.000_001 + 1);
    });
    const [done] = await deliveries(row.id);
    expect(done).toMatchObject({
      status: "failed",
      attempts: WEBHOOK_RETRY_DELAYS_SEC.length + 1,
      next_attempt_at: null,
    });
    expect(receiver.received).toHaveLength(WEBHOOK_RETRY_DELAYS_SEC.length + 1);
    t.clock.advance(100 * 3600);
    expect(await d.runOnce()).toBe(0);
  });

  test("a restart mid-retry continues from the store: new services over the same data dir deliver it", async () => {
    const { row, secret } = subscribe();
    receiver.behaviour = () => new Response("down", { status: 502 });
    await customerCreated();
    expect(await dispatcher().runOnce()).toBe(1);
    // A second process: its own connection, data key and dispatcher over the same files.
    const store = openStore(`${t.dir}/licensing.db`);
    try {
      const deps: Deps = {
        ...t.deps,
        db: store.db,
        sqlite: store.sqlite,
        ids: new IdGenerator(),
        secrets: new SecretBox(t.deps.keystore.secret("data-key")),
      };
      receiver.behaviour = () => new Response("ok");
      t.clock.advance(6);
      expect(await dispatcher({}, deps).runOnce()).toBe(1);
    } finally {
      store.close();
    }
    expect(receiver.received).toHaveLength(2);
    expect(receiver.received[1]?.headers["webhook-id"]).toBe(
      receiver.received[0]?.headers["webhook-id"] as string,
    );
    verify(secret as string, receiver.received[1] as Received);
    expect((await deliveries(row.id))[0]).toMatchObject({ status: "succeeded", attempts: 2 });
  });

  test("a delivery claimed by a process that died is due again once its claim lapses, not before", async () => {
    subscribe();
    await customerCreated();
    let release: () => void = () => {};
    receiver.behaviour = () =>
      new Promise<Response>((resolve) => {
        release = () => resolve(new Response("late"));
      });
    // The first dispatcher claims and hangs; it stands for a process killed mid-attempt.
    const hung = dispatcher({ timeoutMs: 45_000 });
    void hung.runOnce();
    while (receiver.received.length === 0) await Bun.sleep(5);
    receiver.behaviour = () => new Response("ok");
    const next = dispatcher();
    expect(await next.runOnce()).toBe(0);
    t.clock.advance(61);
    expect(await next.runOnce()).toBe(1);
    expect(receiver.received).toHaveLength(2);
    release();
    await hung.idle();
    const status = t.deps.sqlite.query("SELECT status, attempts FROM webhook_deliveries").get();
    // The late answer of the dead attempt does not undo the redelivery.
    expect(status).toMatchObject({ status: "succeeded" });
  });
});

describe("a delivery cancelled while its attempt is in flight", () => {
  /** Holds the receiver's answer to its first request until `answer` is called. */
  function holdFirstAnswer(): { answer: (response: Response) => void } {
    const held = { answer: (_response: Response) => {} };
    const first = new Promise<Response>((resolve) => {
      held.answer = resolve;
    });
    const then = receiver.behaviour;
    receiver.behaviour = (request, n) => (n === 1 ? first : then(request, n));
    return held;
  }

  test("counts the attempt and is succeeded when the receiver answered 2xx: it has the event", async () => {
    const { row } = subscribe();
    const held = holdFirstAnswer();
    await customerCreated();
    const pass = dispatcher().runOnce();
    while (receiver.received.length === 0) await Bun.sleep(5);
    expect((await t.call("DELETE", `/mgmt/v1/webhooks/${row.id}`)).status).toBe(204);
    expect((await deliveries(row.id))[0]?.status).toBe("cancelled");
    held.answer(new Response("ok"));
    await pass;
    const [after] = await deliveries(row.id);
    expect(after).toMatchObject({
      status: "succeeded",
      attempts: 1,
      last_response_status: 200,
      last_error: null,
    });
    expect(after?.completed_at).not.toBeNull();
    const detail = await delivery(row.id, after?.id as string);
    expect(detail.attempt_log).toMatchObject([{ number: 1, outcome: "succeeded", response_status: 200 }]);
  });

  test("counts a failed attempt and stays cancelled, never retried", async () => {
    const { row } = subscribe();
    const held = holdFirstAnswer();
    await customerCreated();
    const d = dispatcher();
    const pass = d.runOnce();
    while (receiver.received.length === 0) await Bun.sleep(5);
    expect((await t.call("DELETE", `/mgmt/v1/webhooks/${row.id}`)).status).toBe(204);
    const [cancelled] = await deliveries(row.id);
    held.answer(new Response("down", { status: 503 }));
    await pass;
    const [after] = await deliveries(row.id);
    expect(after).toMatchObject({
      status: "cancelled",
      attempts: 1,
      next_attempt_at: null,
      last_response_status: 503,
      last_error: "HTTP 503",
      completed_at: cancelled?.completed_at,
    });
    t.clock.advance(86_400);
    expect(await d.runOnce()).toBe(0);
    expect(receiver.received).toHaveLength(1);
  });

  test("by a 410 to another delivery of its endpoint, still counts its own 2xx as succeeded", async () => {
    const { row } = subscribe();
    receiver.behaviour = () => new Response("gone", { status: 410 });
    const held = holdFirstAnswer();
    await customerCreated("A");
    await customerCreated("B");
    const pass = dispatcher({ perEndpointConcurrency: 2 }).runOnce();
    // The second request answers 410 at once and disables the endpoint; the first is still out.
    while ((await t.call("GET", `/mgmt/v1/webhooks/${row.id}`)).body.data.status !== "disabled")
      await Bun.sleep(5);
    held.answer(new Response("ok"));
    await pass;
    const log = await deliveries(row.id);
    expect(log.map((d) => [d.status, d.attempts, d.last_response_status]).sort()).toEqual([
      ["failed", 1, 410],
      ["succeeded", 1, 200],
    ]);
  });
});

describe("a delivery left queued on an endpoint that no longer receives", () => {
  test("is cancelled by the sweep, while queued deliveries of active endpoints stay", async () => {
    const stopped = subscribe();
    const active = subscribe();
    await customerCreated();
    // As a store written by a version that stopped endpoints without cancelling their queue.
    t.deps.sqlite.run("UPDATE webhook_endpoints SET status = 'stopped' WHERE id = ?", [stopped.row.id]);
    const swept = sweepOnce(createServices(t.deps, { baseUrl: "http://licensing.test" }), silentLogger);
    expect(swept.orphaned_webhook_deliveries).toBe(1);
    expect((await deliveries(stopped.row.id)).map((d) => d.status)).toEqual(["cancelled"]);
    expect((await deliveries(active.row.id)).map((d) => d.status)).toEqual(["pending"]);
  });

  test("cannot be made by a replay: the endpoint's check and the update are one transaction", async () => {
    const { row } = subscribe();
    await customerCreated();
    await dispatcher().runOnce();
    const [done] = await deliveries(row.id);
    // Another process stops the endpoint, holding the write lock while the replay comes in.
    const stopper = Bun.spawn(
      [
        process.execPath,
        "-e",
        `const { Database } = require("bun:sqlite");
         const db = new Database(process.argv[1]);
         db.run("BEGIN IMMEDIATE");
         db.run("UPDATE webhook_endpoints SET status = 'stopped' WHERE id = ?", [process.argv[2]]);
         console.log("locked");
         await Bun.sleep(300);
         db.run("COMMIT");`,
        t.deps.sqlite.filename,
        row.id,
      ],
      { stdout: "pipe" },
    );
    const reader = stopper.stdout.getReader();
    expect(new TextDecoder().decode((await reader.read()).value)).toContain("locked");
    const replay = await t.call("POST", `/mgmt/v1/webhooks/${row.id}/deliveries/${done?.id}/replay`);
    expect(await stopper.exited).toBe(0);
    expect([replay.status, replay.body.error?.code]).toEqual([422, "INVALID_TRANSITION"]);
    expect((await deliveries(row.id)).map((d) => d.status)).toEqual(["succeeded"]);
  });
});
