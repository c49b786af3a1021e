import { describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { eq } from "drizzle-orm";
import { auditEvents, billingEvents, mailOutbox } from "../../src/store/schema/index.ts";
import {
  ACTOR,
  billing,
  checkout,
  configureTest,
  deliver,
  event,
  ids,
  licensesOfCheckout,
  next,
  offering,
  TEST_API_KEY,
  TEST_SECRET,
  t,
  useBillingContext,
} from "../support/billing.ts";
import { factories } from "../support/factories.ts";
import { BASE_URL } from "../support/harness.ts";
import { storeDigest } from "../support/store-digest.ts";

/**
 * What a completed checkout does, delivered as Stripe signs it: one customer and one license,
 * exactly once, however often the event comes; the failures that are ours (an unreachable provider
 * API, an archived product); and the claim link or key the buyer is emailed.
 */
useBillingContext({ configured: true });

describe("checkout", () => {
  test("creates one customer and one license, audited as billing, and emails a claim link", async () => {
    const price = offering(ids.policy, { licenseDurationDays: 30 });
    const email = `${next("ada")}@example.com`;
    const session = { ...checkout(price, { email, lineItems: true }), locale: "de" };
    const e = event("checkout.session.completed", session);
    const before = t.clock.now().getTime();
    const response = await deliver(e);
    const after = t.clock.now().getTime();
    expect(response.body.data).toEqual({ event_id: e.id, result: "succeeded", replayed: false });
    const [license, ...others] = licensesOfCheckout(session.id);
    expect(others).toEqual([]);
    expect(license?.productId).toBe(ids.product);
    const expiry = license?.expiresAt?.getTime() ?? 0;
    expect(expiry).toBeGreaterThanOrEqual(before + 30 * 86_400_000);
    expect(expiry).toBeLessThanOrEqual(after + 30 * 86_400_000);
    const customer = await t.call("GET", `/mgmt/v1/customers/${license?.customerId}`, { key: t.keys.test });
    expect(customer.body.data).toMatchObject({ email, name: "Ada Buyer" });
    const audit = t.deps.db
      .select()
      .from(auditEvents)
      .where(eq(auditEvents.targetId, license?.id as string))
      .all();
    expect(audit.map((row) => [row.type, row.actor])).toEqual([
      ["license.created", { type: "billing", id: "stripe" }],
    ]);
    const mail = t.deps.db.select().from(mailOutbox).where(eq(mailOutbox.recipient, email)).all();
    expect(mail.map((row) => [row.template, row.locale])).toEqual([["license_delivery", "de"]]);
    const status = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
    expect(status.body.data.last_event).toMatchObject({
      id: e.id,
      type: e.type,
      result: "succeeded",
      reason: null,
    });
  });

  test("a buyer whose address has an international domain gets the customer stored with its punycode, not a second one", async () => {
    const local = next("ida");
    const existing = factories(t).customer({ email: `${local}@xn--bcher-kva.example` });
    const session = checkout(offering(), { email: `${local}@Bücher.example` });
    expect((await deliver(event("checkout.session.completed", session))).body.data.result).toBe("succeeded");
    expect(licensesOfCheckout(session.id).map((license) => license.customerId)).toEqual([existing.id]);
    const found = await t.call("GET", `/mgmt/v1/customers?email=${local}@xn--bcher-kva.example`, {
      key: t.keys.test,
    });
    expect(found.body.data).toHaveLength(1);
  });

  test("delivered twice, concurrently, and then again as a second event of the same checkout, it makes exactly one license", async () => {
    const price = offering();
    const session = checkout(price);
    const e = event("checkout.session.completed", session);
    const [a, b] = await Promise.all([deliver(e), deliver(e)]);
    expect([a.status, b.status]).toEqual([200, 200]);
    expect([a.body.data.replayed, b.body.data.replayed].sort()).toEqual([false, true]);
    const again = await deliver(event("checkout.session.async_payment_succeeded", session));
    expect(again.body.data).toMatchObject({ result: "ignored", replayed: false });
    expect(licensesOfCheckout(session.id)).toHaveLength(1);
  });

  test("replaying a processed event answers 200 and changes nothing stored", async () => {
    const session = checkout(offering());
    const e = event("checkout.session.completed", session);
    expect((await deliver(e)).body.data.result).toBe("succeeded");
    const before = storeDigest(t.deps.sqlite);
    t.clock.advance(60);
    const replay = await deliver(e);
    expect(replay.status).toBe(200);
    expect(replay.body.data).toEqual({ event_id: e.id, result: "succeeded", replayed: true });
    expect(storeDigest(t.deps.sqlite)).toBe(before);
  });

  test("an unknown price is recorded as failed with a 200, and the same event succeeds once an offering exists", async () => {
    const price = `price_unknown${Date.now()}`;
    const session = checkout(price);
    const e = event("checkout.session.completed", session);
    const first = await deliver(e);
    expect(first.status).toBe(200);
    expect(first.body.data.result).toBe("failed");
    expect(licensesOfCheckout(session.id)).toHaveLength(0);
    const status = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
    expect(status.body.data.last_event).toMatchObject({
      id: e.id,
      result: "failed",
      reason: "unknown_price",
    });
    billing.addOffering({ priceId: price, productId: ids.product, policyId: ids.policy }, ACTOR);
    expect((await deliver(e)).body.data.result).toBe("succeeded");
    expect(licensesOfCheckout(session.id)).toHaveLength(1);
    expect(
      t.deps.db.select().from(billingEvents).where(eq(billingEvents.eventId, e.id)).get()?.attempts,
    ).toBe(2);
  });

  test("an unhandled event type is a 200, ignored, and shown as the last event", async () => {
    const e = event("charge.refunded", { id: next("ch") });
    expect((await deliver(e)).body.data.result).toBe("ignored");
    const status = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
    expect(status.body.data.last_event).toMatchObject({
      id: e.id,
      type: "charge.refunded",
      result: "ignored",
    });
  });

  test("line items are read from the provider's API when the event does not carry them", async () => {
    const price = offering();
    const seen: string[] = [];
    const server = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch(request) {
        seen.push(`${new URL(request.url).pathname} ${request.headers.get("authorization")}`);
        return Response.json({
          object: "list",
          data: [{ id: "li_1", price: { id: price } }],
          has_more: false,
        });
      },
    });
    try {
      billing.configure(
        {
          provider: "stripe",
          apiKey: TEST_API_KEY,
          webhookSecret: TEST_SECRET,
          secureClaims: true,
          apiBaseUrl: `http://127.0.0.1:${server.port}`,
        },
        ACTOR,
      );
      const session = { ...checkout(price), metadata: {} };
      expect((await deliver(event("checkout.session.completed", session))).body.data.result).toBe(
        "succeeded",
      );
      expect(seen).toEqual([`/v1/checkout/sessions/${session.id}/line_items Bearer ${TEST_API_KEY}`]);
      expect(licensesOfCheckout(session.id)).toHaveLength(1);
    } finally {
      server.stop(true);
      configureTest();
    }
  });
});

describe("failures on our side", () => {
  test("an unreachable provider API is a retryable 503 that records no processed event, so the retry is applied", async () => {
    const price = offering();
    const closed = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("") });
    const port = closed.port;
    closed.stop(true);
    billing.configure(
      {
        provider: "stripe",
        apiKey: TEST_API_KEY,
        webhookSecret: TEST_SECRET,
        secureClaims: true,
        apiBaseUrl: `http://127.0.0.1:${port}`,
      },
      ACTOR,
    );
    const session = { ...checkout(price), metadata: {} };
    const e = event("checkout.session.completed", session);
    try {
      const response = await deliver(e);
      expect(response.status).toBe(503);
      expect(response.body.error).toMatchObject({ code: "SERVICE_UNAVAILABLE", retryable: true });
      expect(
        t.deps.db.select().from(billingEvents).where(eq(billingEvents.eventId, e.id)).get(),
      ).toBeUndefined();
      const status = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
      expect(status.body.data.last_event).toMatchObject({
        id: e.id,
        result: "failed",
        reason: "provider_unreachable",
      });
    } finally {
      configureTest();
    }
    // The provider retries; this time the event carries what is needed.
    const retried = await deliver(e, {
      payload: JSON.stringify({ ...e, data: { object: checkout(price) } }),
    });
    expect(retried.body.data.result).toBe("succeeded");
  });

  test("a checkout for an archived product is recorded as failed and creates nothing", async () => {
    const f = factories(t);
    const product = f.product({ environment: "test" });
    const policy = f.policy({ productId: product.id, environment: "test" });
    const price = `price_archived${Date.now()}`;
    billing.addOffering({ priceId: price, productId: product.id, policyId: policy.id }, ACTOR);
    await t.call("DELETE", `/mgmt/v1/products/${product.id}`, { key: t.keys.test });
    const session = checkout(price);
    const response = await deliver(event("checkout.session.completed", session));
    expect(response.status).toBe(200);
    expect(response.body.data.result).toBe("failed");
    expect(licensesOfCheckout(session.id)).toHaveLength(0);
    const status = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
    expect(status.body.data.last_event).toMatchObject({ result: "failed", reason: "PRODUCT_ARCHIVED" });
  });
});

describe("claims", () => {
  test("a claim link shows the key once; the second attempt and a made-up token are the same 410", async () => {
    const session = checkout(offering());
    const e = event("checkout.session.completed", session);
    await deliver(e);
    const mail = t.deps.db
      .select()
      .from(mailOutbox)
      .where(eq(mailOutbox.recipient, session.customer_details.email))
      .get();
    const data = JSON.parse(t.deps.secrets.decrypt(mail?.payload as string, `mail_outbox:${mail?.id}`));
    expect(data.license_key).toBeUndefined();
    const [url, token] = String(data.claim_url).split("#");
    expect(url).toBe(`${BASE_URL}/billing/v1/claims`);
    const page = await t.call("GET", "/billing/v1/claims", { key: null });
    expect(page.headers.get("content-type")).toContain("text/html");
    // The page loads nothing from elsewhere, runs only its own script and is never cached.
    expect(page.headers.get("content-security-policy")).toContain("default-src 'none'");
    expect(page.headers.get("cache-control")).toBe("no-store");
    expect(page.text).not.toMatch(/(src|href)=["']?(https?:)?\/\//);
    const first = await t.call("POST", "/billing/v1/claims/redeem", { key: null, body: { token } });
    expect(first.status).toBe(200);
    // The answer carries the license key: no cache may keep it.
    expect(first.headers.get("cache-control")).toBe("no-store");
    const [license] = licensesOfCheckout(session.id);
    const managed = await t.call("GET", `/mgmt/v1/licenses/${license?.id}`, { key: t.keys.test });
    expect(first.body.data).toMatchObject({ license_id: license?.id, license_key: managed.body.data.key });
    for (const attempt of [token, randomBytes(32).toString("base64url")]) {
      const again = await t.call("POST", "/billing/v1/claims/redeem", {
        key: null,
        body: { token: attempt },
      });
      expect(again.status).toBe(410);
      expect(again.body.error.code).toBe("LICENSE_CLAIM_UNAVAILABLE");
      expect(again.headers.get("cache-control")).toBe("no-store");
    }
  });

  test.each([
    ["malformed JSON", "/billing/v1/claims/redeem", "{", "application/json", 400],
    ["a form body", "/billing/v1/claims/redeem", "token=abc", "application/x-www-form-urlencoded", 400],
    ["text/plain", "/billing/v1/claims/redeem", JSON.stringify({ token: "A".repeat(43) }), "text/plain", 400],
    [
      "a token that is not a string",
      "/billing/v1/claims/redeem",
      JSON.stringify({ token: 1 }),
      "application/json",
      422,
    ],
    [
      "an unexpected field",
      "/billing/v1/claims/redeem",
      JSON.stringify({ token: "A".repeat(43), x: 1 }),
      "application/json",
      422,
    ],
    [
      "a token too long",
      "/billing/v1/claims/redeem",
      JSON.stringify({ token: "A".repeat(129) }),
      "application/json",
      422,
    ],
    ["an empty body", "/billing/v1/claims/redeem", "", "application/json", 400],
    ["a trailing slash and no token", "/billing/v1/claims/redeem/", "{}", "application/json", 422],
    [
      "an unknown token",
      "/billing/v1/claims/redeem",
      JSON.stringify({ token: "A".repeat(43) }),
      "application/json",
      410,
    ],
  ])(
    "a redeem refused for %s still says Cache-Control: no-store",
    async (_name, path, rawBody, contentType, status) => {
      const answer = await t.call("POST", path, {
        key: null,
        rawBody,
        headers: { "content-type": contentType },
      });
      expect([answer.status, answer.headers.get("cache-control")]).toEqual([status, "no-store"]);
    },
  );

  test("with secure claims off, the email carries the key itself", async () => {
    configureTest({ secureClaims: false });
    try {
      const session = checkout(offering());
      await deliver(event("checkout.session.completed", session));
      const mail = t.deps.db
        .select()
        .from(mailOutbox)
        .where(eq(mailOutbox.recipient, session.customer_details.email))
        .get();
      const data = JSON.parse(t.deps.secrets.decrypt(mail?.payload as string, `mail_outbox:${mail?.id}`));
      const [license] = licensesOfCheckout(session.id);
      const managed = await t.call("GET", `/mgmt/v1/licenses/${license?.id}`, { key: t.keys.test });
      expect(data).toMatchObject({ license_key: managed.body.data.key });
      expect(data.claim_url).toBeUndefined();
    } finally {
      configureTest();
    }
  });
});
