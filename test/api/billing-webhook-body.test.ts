import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { unixSeconds } from "../../src/domain/clock.ts";
import { LARGE_BODY_SLOTS, LARGE_BODY_SLOTS_PER_ADDRESS } from "../../src/http/body.ts";
import { clientAddress } from "../../src/http/client-address.ts";
import { BillingService } from "../../src/modules/billing/service.ts";
import { header, WEBHOOK } from "../support/billing.ts";
import { BASE_URL, createTestContext, serveTestStore, type TestContext } from "../support/harness.ts";
import { storeDigest } from "../support/store-digest.ts";

/**
 * The billing webhook's body limit. Stripe sends whole objects (an invoice with its lines, a
 * checkout session with its items), well past the 64 KiB of a management body; a delivery refused
 * for its size would be refused on every retry until Stripe gives up, so the route takes up to
 * 1 MiB. Signatures are made by Stripe's own library.
 */
const SECRET = `whsec_${randomBytes(24).toString("base64")}`;
const MIB = 1024 * 1024;

let t: TestContext;
beforeAll(() => {
  t = createTestContext();
  new BillingService(t.deps, () => t.workspace.plan(), BASE_URL).configure(
    {
      provider: "stripe",
      apiKey: `rk_test_${randomBytes(24).toString("hex")}`,
      webhookSecret: SECRET,
      secureClaims: true,
    },
    { type: "cli", id: "test" },
  );
});
afterAll(() => t.close());

let counter = 0;
/** A signed event whose JSON text is exactly `size` bytes (an ignored type: only its size matters here). */
function sizedEvent(size: number, nowSec: number): string {
  const id = `evt_body_${Date.now().toString(36)}${++counter}`;
  const shell = (padding: string) =>
    JSON.stringify({
      id,
      object: "event",
      api_version: "2025-03-31.basil",
      created: nowSec,
      livemode: false,
      type: "customer.updated",
      data: { object: { id: "cus_big", object: "customer", metadata: { note: padding } } },
    });
  const payload = shell("x".repeat(size - shell("").length));
  expect(Buffer.byteLength(payload)).toBe(size);
  return payload;
}

async function deliver(payload: string) {
  return t.call("POST", WEBHOOK, {
    key: null,
    rawBody: payload,
    headers: {
      "content-type": "application/json; charset=utf-8",
      "stripe-signature": await header(payload, { secret: SECRET, timestamp: unixSeconds(t.clock.now()) }),
    },
  });
}

describe("POST /billing/v1/stripe/webhook body limit", () => {
  test("a 200 KiB signed event is accepted", async () => {
    const response = await deliver(sizedEvent(200 * 1024, unixSeconds(t.clock.now())));
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({ result: "ignored", replayed: false });
  });

  test("an event of exactly 1 MiB is accepted", async () => {
    const response = await deliver(sizedEvent(MIB, unixSeconds(t.clock.now())));
    expect(response.status).toBe(200);
  });

  test("one byte more than 1 MiB is a 413 in the error envelope and changes nothing", async () => {
    const before = storeDigest(t.deps.sqlite);
    const response = await deliver(sizedEvent(MIB + 1, unixSeconds(t.clock.now())));
    expect(response.status).toBe(413);
    expect(response.body.error).toMatchObject({
      code: "PAYLOAD_TOO_LARGE",
      details: { limit_bytes: MIB },
    });
    expect(response.body.error.request_id).toBe(response.headers.get("x-request-id"));
    expect(storeDigest(t.deps.sqlite)).toBe(before);
  });

  test("management routes keep their 64 KiB limit", async () => {
    const response = await t.call("POST", "/mgmt/v1/customers", {
      body: { name: "Big", email: "big@example.com", metadata: { note: "x".repeat(70_000) } },
      headers: t.idem(),
    });
    expect(response.status).toBe(413);
    expect(response.body.error.details).toEqual({ limit_bytes: 64 * 1024 });
  });

  test("over HTTP, a 200 KiB event is accepted and a streamed body past 1 MiB is refused with the envelope", async () => {
    const server = serveTestStore(t);
    try {
      const send = async (payload: string, chunked = false) => {
        const body = chunked
          ? new ReadableStream<Uint8Array>({
              start(controller) {
                const bytes = new TextEncoder().encode(payload);
                for (let i = 0; i < bytes.byteLength; i += 64 * 1024)
                  controller.enqueue(bytes.slice(i, i + 64 * 1024));
                controller.close();
              },
            })
          : payload;
        return fetch(`${server.url}${WEBHOOK}`, {
          method: "POST",
          headers: {
            "content-type": "application/json; charset=utf-8",
            "stripe-signature": await header(payload, {
              secret: SECRET,
              timestamp: Math.floor(Date.now() / 1000),
            }),
          },
          body,
        });
      };
      const now = Math.floor(Date.now() / 1000);
      const accepted = await send(sizedEvent(200 * 1024, now));
      expect(accepted.status, await accepted.clone().text()).toBe(200);
      for (const chunked of [false, true]) {
        const refused = await send(sizedEvent(MIB + 1, now), chunked);
        expect(refused.status).toBe(413);
        const body = (await refused.json()) as { error: { code: string; details: unknown } };
        expect(body.error).toMatchObject({ code: "PAYLOAD_TOO_LARGE", details: { limit_bytes: MIB } });
      }
    } finally {
      await server.shutdown("test");
    }
  });
});

describe("what is refused before the body is read", () => {
  /** A body that never ends: a route that waited for it would never answer. */
  const endless = () => {
    let stop: () => void = () => {};
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new TextEncoder().encode('{"id":"evt_'));
        stop = () => controller.error(new Error("the client went away"));
      },
    });
    return { body, stop: () => stop() };
  };
  const post = (
    context: TestContext,
    body: ReadableStream<Uint8Array>,
    headers: Record<string, string> = {},
  ) =>
    context.app.handle(
      new Request(`${BASE_URL}${WEBHOOK}`, {
        method: "POST",
        body,
        headers: { "content-type": "application/json", ...headers },
      }),
    );
  const signed = async () => ({
    "stripe-signature": await header("{}", { secret: SECRET, timestamp: unixSeconds(t.clock.now()) }),
  });

  test("without a billing integration the webhook answers 404 without waiting for the body", async () => {
    const bare = createTestContext();
    try {
      const { body, stop } = endless();
      const response = await post(bare, body, await signed());
      stop();
      expect(response.status).toBe(404);
      expect((await response.json()).error.code).toBe("NOT_FOUND");
    } finally {
      bare.close();
    }
  });

  test("without a well-formed Stripe-Signature header the webhook answers 400 without waiting for the body", async () => {
    for (const headers of [{}, { "stripe-signature": "t=1" }] as Record<string, string>[]) {
      const { body, stop } = endless();
      const response = await post(t, body, headers);
      stop();
      expect(response.status).toBe(400);
      expect((await response.json()).error.code).toBe("BILLING_SIGNATURE_INVALID");
    }
  });

  /** A request whose body stalls after its first bytes, declaring `declared` bytes (or chunked). */
  const stalledFrom = (
    address: string,
    headers: Record<string, string>,
    options: { declared?: number; sent?: number } = {},
  ) => {
    let stop: () => void = () => {};
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new Uint8Array(options.sent ?? 1).fill(0x20));
        stop = () => controller.error(new Error("the client went away"));
      },
    });
    const request = new Request(`${BASE_URL}${WEBHOOK}`, {
      method: "POST",
      body,
      headers: {
        "content-type": "application/json",
        ...(options.declared !== undefined ? { "content-length": String(options.declared) } : {}),
        ...headers,
      },
    });
    clientAddress.set(request, address);
    return { response: t.app.handle(request), stop: () => stop() };
  };
  const refusal = async (response: Response, reason: string) => {
    expect(response.status).toBe(503);
    expect(response.headers.get("retry-after")).toBe("1");
    expect((await response.json()).error).toMatchObject({ code: "SERVICE_UNAVAILABLE", details: { reason } });
  };

  test(`past ${LARGE_BODY_SLOTS} large bodies being received, the next answers 503 with Retry-After, and the slots come back`, async () => {
    const headers = await signed();
    const stalled = Array.from({ length: LARGE_BODY_SLOTS }, (_, i) =>
      stalledFrom(`198.51.100.${i + 1}`, headers, { declared: MIB }),
    );
    const refused = stalledFrom("203.0.113.1", headers, { declared: MIB });
    await refusal(await refused.response, "large_bodies_in_flight");
    // A body sent chunked takes its slot once it has passed 64 KiB, and is refused then.
    const chunked = stalledFrom("203.0.113.2", headers, { sent: 64 * 1024 + 1 });
    await refusal(await chunked.response, "large_bodies_in_flight");
    for (const { stop: hangUp } of stalled) hangUp();
    await Promise.all(stalled.map(({ response }) => response));
    const response = await deliver(sizedEvent(200 * 1024, unixSeconds(t.clock.now())));
    expect(response.status).toBe(200);
  });

  test("while every large-body slot is held, an event of ordinary size (declared or chunked) is still received", async () => {
    const headers = await signed();
    const stalled = Array.from({ length: LARGE_BODY_SLOTS }, (_, i) =>
      stalledFrom(`198.51.100.${i + 1}`, headers, { declared: MIB }),
    );
    try {
      await refusal(
        await stalledFrom("203.0.113.1", headers, { declared: MIB }).response,
        "large_bodies_in_flight",
      );
      const now = unixSeconds(t.clock.now());
      const chunked = await deliver(sizedEvent(32 * 1024, now));
      expect(chunked.status).toBe(200);
      const payload = sizedEvent(64 * 1024, now);
      const declared = await t.call("POST", WEBHOOK, {
        key: null,
        rawBody: payload,
        headers: {
          "content-type": "application/json",
          "content-length": String(Buffer.byteLength(payload)),
          "stripe-signature": await header(payload, { secret: SECRET, timestamp: now }),
        },
      });
      expect(declared.status).toBe(200);
      expect(declared.body.data).toMatchObject({ result: "ignored", replayed: false });
    } finally {
      for (const { stop: hangUp } of stalled) hangUp();
      await Promise.all(stalled.map(({ response }) => response));
    }
  });

  test(`one address holds at most ${LARGE_BODY_SLOTS_PER_ADDRESS} large-body slots; other addresses still get theirs`, async () => {
    const headers = await signed();
    const mine = Array.from({ length: LARGE_BODY_SLOTS_PER_ADDRESS }, () =>
      stalledFrom("203.0.113.9", headers, { declared: MIB }),
    );
    // The same /64 is the same client.
    const v6 = Array.from({ length: LARGE_BODY_SLOTS_PER_ADDRESS }, (_, i) =>
      stalledFrom(`2001:db8:1:2::${i + 1}`, headers, { sent: 64 * 1024 + 1 }),
    );
    const others = Array.from({ length: LARGE_BODY_SLOTS - 2 * LARGE_BODY_SLOTS_PER_ADDRESS }, (_, i) =>
      stalledFrom(`198.51.100.${i + 1}`, headers, { declared: MIB }),
    );
    try {
      await refusal(
        await stalledFrom("203.0.113.9", headers, { declared: MIB }).response,
        "large_bodies_from_address",
      );
      await refusal(
        await stalledFrom("2001:db8:1:2::ffff", headers, { declared: MIB }).response,
        "large_bodies_from_address",
      );
      // The others were not refused: each is still waiting for its body.
      const settled = await Promise.race([
        Promise.any([...mine, ...v6, ...others].map(({ response }) => response)).then(() => true),
        Bun.sleep(50).then(() => false),
      ]);
      expect(settled).toBe(false);
    } finally {
      for (const { stop: hangUp } of [...mine, ...v6, ...others]) hangUp();
      await Promise.all([...mine, ...v6, ...others].map(({ response }) => response));
    }
    // Released: the address may send large bodies again.
    const again = await deliver(sizedEvent(200 * 1024, unixSeconds(t.clock.now())));
    expect(again.status).toBe(200);
  });
});
