import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Server } from "bun";
import { Webhook } from "standardwebhooks";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import type { Deps } from "../../src/deps.ts";
import { IdGenerator } from "../../src/domain/ids.ts";
import { type Logger, silentLogger } from "../../src/http/logger.ts";
import {
  type DispatcherOptions,
  RETRY_JITTER,
  WEBHOOK_RETRY_DELAYS_SEC,
  WebhookDispatcher,
} from "../../src/jobs/webhook-dispatcher.ts";
import { WebhookService } from "../../src/modules/webhooks/service.ts";
import { openStore } from "../../src/store/db.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * Webhook delivery against a real HTTP receiver on 127.0.0.1 (Bun.serve). Every request the
 * receiver gets is verified with the `standardwebhooks` package, the reference implementation
 * receivers use. Time for the retry schedule comes from the test clock; the signature timestamp
 * is real time, as receivers check it against their own clock.
 */
interface Received {
  path: string;
  headers: Record<string, string>;
  body: string;
}

type Behaviour = (request: Request, n: number) => Response | Promise<Response>;

class Receiver {
  readonly received: Received[] = [];
  behaviour: Behaviour = () => new Response("ok");
  inFlight = 0;
  maxInFlight = 0;
  private readonly server: Server<undefined>;

  constructor() {
    this.server = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch: async (request) => {
        const body = await request.text();
        this.received.push({
          path: new URL(request.url).pathname,
          headers: Object.fromEntries(request.headers.entries()),
          body,
        });
        this.inFlight++;
        this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
        try {
          return await this.behaviour(request, this.received.length);
        } finally {
          this.inFlight--;
        }
      },
    });
  }

  url(path = "/hook"): string {
    return `http://127.0.0.1:${this.server.port}${path}`;
  }

  get port(): number {
    return this.server.port as number;
  }

  stop(): void {
    this.server.stop(true);
  }
}

let t: TestContext;
let receiver: Receiver;
const ctx = { actor: { type: "cli" as const, id: "test" }, environment: "live" as const, requestId: null };

beforeEach(() => {
  t = createTestContext();
  receiver = new Receiver();
});
afterEach(() => {
  receiver.stop();
  t.close();
});

const endpoints = (deps: Deps = t.deps, allowPrivateNetworks = true) =>
  new WebhookService(deps, { allowPrivateNetworks });

function dispatcher(options: Partial<DispatcherOptions> = {}, deps: Deps = t.deps) {
  return new WebhookDispatcher(deps, {
    logger: silentLogger,
    allowPrivateNetworks: true,
    clock: t.clock,
    random: () => 0.5,
    ...options,
  });
}

function subscribe(url = receiver.url(), events = ["customer.created"]) {
  return endpoints().create({ url, events }, ctx);
}

/** Makes a change through the Management API; its audit event is what gets delivered. */
async function customerCreated(name = "Ada"): Promise<string> {
  const response = await t.call("POST", "/mgmt/v1/customers", { body: { name }, headers: t.idem() });
  expect(response.status).toBe(201);
  return response.body.data.public_id;
}

function verify(secret: string, received: Received) {
  return new Webhook(secret).verify(received.body, received.headers) as Record<string, unknown>;
}

async function deliveries(endpointId: string) {
  const response = await t.call("GET", `/mgmt/v1/webhooks/${endpointId}/deliveries`);
  expect(response.status).toBe(200);
  return response.body.data as Record<string, unknown>[];
}

async function delivery(endpointId: string, deliveryId: string) {
  const response = await t.call("GET", `/mgmt/v1/webhooks/${endpointId}/deliveries/${deliveryId}`);
  expect(response.status).toBe(200);
  return response.body.data;
}

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
    const hung = dispatcher({ claimMs: 60_000, timeoutMs: 30_000 });
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

describe("https receivers", () => {
  /** A self-signed certificate for `name`, made with openssl for this test only. */
  function certificate(name: string): { key: string; cert: string } {
    const dir = mkdtempSync(join(tmpdir(), "webhook-tls-"));
    try {
      const made = Bun.spawnSync(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
          .concat(["-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem"), "-days", "2"])
          .concat(["-subj", `/CN=${name}`, "-addext", `subjectAltName=DNS:${name}`]),
        { stderr: "pipe" },
      );
      expect(made.exitCode, "openssl must be installed").toBe(0);
      return {
        key: readFileSync(join(dir, "key.pem"), "utf8"),
        cert: readFileSync(join(dir, "cert.pem"), "utf8"),
      };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }

  test("connect to the checked address and verify the certificate against the URL's name", async () => {
    const { key, cert } = certificate("hooks.vendor.test");
    const hosts: string[] = [];
    const tlsReceiver = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      tls: { key, cert },
      fetch: async (request) => {
        hosts.push(request.headers.get("host") ?? "");
        await request.text();
        return new Response(null, { status: 204 });
      },
    });
    try {
      const good = subscribe(`https://hooks.vendor.test:${tlsReceiver.port}/in`);
      // The same receiver under a name its certificate does not carry: the TLS check must fail.
      const wrong = subscribe(`https://other.vendor.test:${tlsReceiver.port}/in`);
      await customerCreated();
      const resolved: string[] = [];
      await dispatcher({
        extraCa: cert,
        resolver: async (host) => {
          resolved.push(host);
          return ["127.0.0.1"];
        },
      }).runOnce();
      expect(resolved.sort()).toEqual(["hooks.vendor.test", "other.vendor.test"]);
      expect(hosts).toEqual([`hooks.vendor.test:${tlsReceiver.port}`]);
      expect((await deliveries(good.row.id))[0]).toMatchObject({
        status: "succeeded",
        last_response_status: 204,
      });
      expect((await deliveries(wrong.row.id))[0]).toMatchObject({
        status: "pending",
        last_response_status: null,
      });
    } finally {
      tlsReceiver.stop(true);
    }
  });
});

describe("secret rotation", () => {
  test("during the overlap every delivery verifies with both secrets; after it, only with the new one", async () => {
    const service = endpoints();
    const { row, secret: oldSecret } = subscribe();
    const { secret: newSecret } = service.rotateSecret(row.id, 3600, ctx);
    await customerCreated("during");
    await dispatcher().runOnce();
    const during = receiver.received[0] as Received;
    expect(during.headers["webhook-signature"]?.split(" ")).toHaveLength(2);
    expect(verify(oldSecret as string, during).type).toBe("customer.created");
    expect(verify(newSecret, during).type).toBe("customer.created");

    t.clock.advance(3601);
    await customerCreated("after");
    await dispatcher().runOnce();
    const after = receiver.received[1] as Received;
    expect(after.headers["webhook-signature"]?.split(" ")).toHaveLength(1);
    expect(verify(newSecret, after).type).toBe("customer.created");
    expect(() => verify(oldSecret as string, after)).toThrow();
  });
});

describe("team-chat destinations", () => {
  test("a Slack URL gets a readable text message and no signature headers; its URL never reaches the log", async () => {
    const lines: string[] = [];
    const logger: Logger = {
      log: (level, msg, fields) => lines.push(JSON.stringify({ level, msg, ...fields })),
    };
    const url = "https://hooks.slack.com/services/T0001/B0002/SECRETPATHTOKEN";
    const { row } = subscribe(url, ["customer.created"]);
    const customerId = await customerCreated();
    receiver.behaviour = (_r, n) => new Response("x", { status: n === 1 ? 500 : 200 });
    const d = dispatcher({
      logger,
      connectOverride: (target) =>
        target.hostname === "hooks.slack.com" ? `http://127.0.0.1:${receiver.port}` : undefined,
    });
    await d.runOnce();
    t.clock.advance(6);
    await d.runOnce();
    expect(receiver.received).toHaveLength(2);
    const got = receiver.received[1] as Received;
    expect(got.path).toBe("/services/T0001/B0002/SECRETPATHTOKEN");
    expect(got.headers["webhook-signature"]).toBeUndefined();
    expect(got.headers["webhook-id"]).toBeUndefined();
    const message = JSON.parse(got.body);
    expect(Object.keys(message)).toEqual(["text"]);
    expect(message.text).toContain("customer.created");
    expect(message.text).toContain(customerId);
    expect(message.text).toContain("[live]");
    expect(lines.length).toBeGreaterThan(0);
    const everything = [
      lines.join("\n"),
      JSON.stringify(await deliveries(row.id)),
      (await t.call("GET", "/mgmt/v1/webhooks")).text,
    ];
    for (const text of everything) expect(text).not.toContain("SECRETPATHTOKEN");
  });
  test.each([
    [
      "Discord",
      "https://discord.com/api/webhooks/42/SECRETPATHTOKEN",
      (m: Record<string, unknown>) => m.content,
    ],
    [
      "Teams",
      "https://prod-1.westeurope.logic.azure.com/workflows/w/triggers/manual/paths/invoke?sig=SECRETPATHTOKEN",
      (m: Record<string, unknown>) =>
        (m as { attachments: { content: { body: { text: string }[] } }[] }).attachments[0]?.content.body[0]
          ?.text,
    ],
  ])("a %s URL gets its service's message shape, unsigned", async (_name, url, textOf) => {
    subscribe(url, ["customer.created"]);
    const customerId = await customerCreated();
    await dispatcher({ connectOverride: () => `http://127.0.0.1:${receiver.port}` }).runOnce();
    const got = receiver.received[0] as Received;
    expect(got.headers["webhook-signature"]).toBeUndefined();
    expect(got.path).toBe(new URL(url).pathname);
    const text = textOf(JSON.parse(got.body));
    expect(text).toContain("customer.created");
    expect(text).toContain(customerId);
  });
});

describe("replay", () => {
  test("sends a finished delivery again with the same id, and refuses one still queued", async () => {
    const { row, secret } = subscribe();
    await customerCreated();
    await dispatcher().runOnce();
    const [done] = await deliveries(row.id);
    const replay = await t.call("POST", `/mgmt/v1/webhooks/${row.id}/deliveries/${done?.id}/replay`);
    expect(replay.status).toBe(200);
    expect(replay.body.data).toMatchObject({ status: "pending", attempts: 1 });
    const again = await t.call("POST", `/mgmt/v1/webhooks/${row.id}/deliveries/${done?.id}/replay`);
    expect(again.status).toBe(422);
    expect(again.body.error.code).toBe("INVALID_TRANSITION");
    await dispatcher().runOnce();
    expect(receiver.received).toHaveLength(2);
    expect(receiver.received[1]?.headers["webhook-id"]).toBe(
      receiver.received[0]?.headers["webhook-id"] as string,
    );
    expect(receiver.received[1]?.body).toBe(receiver.received[0]?.body as string);
    verify(secret as string, receiver.received[1] as Received);
    expect((await delivery(row.id, done?.id as string)).attempt_log).toHaveLength(2);
  });

  test("a test key neither sees nor replays live deliveries", async () => {
    const { row } = subscribe();
    await customerCreated();
    await dispatcher().runOnce();
    const [done] = await deliveries(row.id);
    const list = await t.call("GET", `/mgmt/v1/webhooks/${row.id}/deliveries`, { key: t.keys.test });
    expect(list.body.data).toEqual([]);
    for (const [method, path] of [
      ["GET", `/mgmt/v1/webhooks/${row.id}/deliveries/${done?.id}`],
      ["POST", `/mgmt/v1/webhooks/${row.id}/deliveries/${done?.id}/replay`],
    ] as const) {
      const response = await t.call(method, path, { key: t.keys.test });
      expect(response.status).toBe(404);
    }
  });
});
