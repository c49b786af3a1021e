import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { eq, sql } from "drizzle-orm";
import Stripe from "stripe";
import { unixSeconds } from "../../src/domain/clock.ts";
import { BillingService } from "../../src/modules/billing/service.ts";
import { RENEWAL_GRACE_SEC } from "../../src/modules/billing/subscriptions.ts";
import { auditEvents, billingEvents, licenses, mailOutbox } from "../../src/store/schema/index.ts";
import { factories } from "../support/factories.ts";
import { BASE_URL, createTestContext, serveTestStore, type TestContext } from "../support/harness.ts";
import { storeDigest } from "../support/store-digest.ts";

/**
 * The billing integration against signatures made by Stripe's own library
 * (`stripe.webhooks.generateTestHeaderString`): status, signature checks, and what checkout,
 * renewal and cancellation events do to licenses, each exactly once.
 */
const stripe = new Stripe("sk_test_only_for_the_signing_helper");
// Under Bun the package signs with WebCrypto, which is asynchronous only: hence the Async helper.
const WEBHOOK = "/billing/v1/stripe/webhook";
const TEST_SECRET = `whsec_${randomBytes(24).toString("base64")}`;
const LIVE_SECRET = `whsec_${randomBytes(24).toString("base64")}`;
const TEST_API_KEY = `rk_test_${randomBytes(24).toString("hex")}`;
const LIVE_API_KEY = `rk_live_${randomBytes(24).toString("hex")}`;
const ACTOR = { type: "cli", id: "test" } as const;

let t: TestContext;
let billing: BillingService;
let ids: { product: string; policy: string; subscriptionPolicy: string };
let counter = 0;
const next = (prefix: string) =>
  `${prefix}_${Date.now().toString(36)}${(++counter).toString().padStart(4, "0")}`;

beforeAll(() => {
  t = createTestContext();
  billing = new BillingService(t.deps, () => t.workspace.plan(), BASE_URL);
  const f = factories(t);
  const product = f.product({ environment: "test", name: "Widget Pro" });
  const policy = f.policy({ productId: product.id, environment: "test" });
  const subscriptionPolicy = f.policy({
    productId: product.id,
    environment: "test",
    licenseType: "subscription",
    billingCycle: "monthly",
  });
  ids = { product: product.id, policy: policy.id, subscriptionPolicy: subscriptionPolicy.id };
});
afterAll(() => t.close());

const nowSec = () => unixSeconds(t.clock.now());

function header(payload: string, options: { secret?: string; timestamp?: number } = {}): Promise<string> {
  return stripe.webhooks.generateTestHeaderStringAsync({
    payload,
    secret: options.secret ?? TEST_SECRET,
    timestamp: options.timestamp ?? nowSec(),
  });
}

async function deliver(
  event: object,
  options: { secret?: string; timestamp?: number; signature?: string | null; payload?: string } = {},
) {
  const payload = options.payload ?? JSON.stringify(event);
  const signature = options.signature === undefined ? await header(payload, options) : options.signature;
  return t.call("POST", WEBHOOK, {
    key: null,
    rawBody: payload,
    headers: {
      "content-type": "application/json; charset=utf-8",
      ...(signature === null ? {} : { "stripe-signature": signature }),
    },
  });
}

const event = (type: string, object: Record<string, unknown>, livemode = false) => ({
  id: next("evt"),
  object: "event",
  api_version: "2025-03-31.basil",
  created: nowSec(),
  livemode,
  type,
  data: { object },
});

function checkout(
  price: string,
  options: { subscription?: string; email?: string; lineItems?: boolean } = {},
) {
  return {
    id: next("cs_test"),
    object: "checkout.session",
    mode: options.subscription ? "subscription" : "payment",
    payment_status: "paid",
    status: "complete",
    customer: next("cus"),
    customer_details: { email: options.email ?? `${next("buyer")}@example.com`, name: "Ada Buyer" },
    subscription: options.subscription ?? null,
    ...(options.lineItems
      ? { line_items: { object: "list", data: [{ id: next("li"), price: { id: price } }] } }
      : { metadata: { licensing_price_id: price } }),
  };
}

const invoice = (subscription: string, periodEnd: number) => ({
  id: next("in"),
  object: "invoice",
  status: "paid",
  parent: { type: "subscription_details", subscription_details: { subscription } },
  lines: {
    object: "list",
    data: [{ id: next("il"), period: { start: periodEnd - 30 * 86_400, end: periodEnd } }],
  },
});

const licensesOfCheckout = (sessionId: string) =>
  t.deps.db
    .select()
    .from(licenses)
    .where(sql`json_extract(${licenses.metadata}, '$.checkout_session_id') = ${sessionId}`)
    .all();

function configureTest(options: { secureClaims?: boolean } = {}) {
  billing.configure(
    {
      provider: "stripe",
      apiKey: TEST_API_KEY,
      webhookSecret: TEST_SECRET,
      secureClaims: options.secureClaims ?? true,
    },
    ACTOR,
  );
}

let priceCounter = 0;
function offering(policy = ids.policy, extra: { licenseDurationDays?: number } = {}) {
  const price = `price_${Date.now()}x${++priceCounter}`;
  billing.addOffering({ priceId: price, productId: ids.product, policyId: policy, ...extra }, ACTOR);
  return price;
}

describe("GET /mgmt/v1/billing-integration", () => {
  test("before any set-up it reports an unregistered integration with no offerings and no event", async () => {
    const response = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
    expect(response.status).toBe(200);
    expect(response.body.data).toEqual({
      registered: false,
      provider: null,
      mode: "test",
      status: "not_configured",
      secure_claims_required: true,
      license_claim_url: null,
      webhook_url: `${BASE_URL}${WEBHOOK}`,
      last_event: null,
      offerings: [],
    });
  });

  test("a webhook delivery before any set-up is a 404 and records nothing", async () => {
    const before = storeDigest(t.deps.sqlite);
    const response = await deliver(event("checkout.session.completed", checkout("price_x")));
    expect(response.status).toBe(404);
    expect(storeDigest(t.deps.sqlite)).toBe(before);
  });

  test("once configured it shows the mode's offerings and never the API key or signing secret", async () => {
    configureTest();
    const price = offering(ids.policy, { licenseDurationDays: 365 });
    const asTest = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
    expect(asTest.body.data).toMatchObject({
      registered: true,
      provider: "stripe",
      mode: "test",
      status: "active",
      secure_claims_required: true,
      license_claim_url: `${BASE_URL}/billing/v1/claims`,
    });
    expect(asTest.body.data.offerings).toContainEqual(
      expect.objectContaining({
        billing_price_id: price,
        product_id: ids.product,
        policy_id: ids.policy,
        status: "active",
        license_duration_days: 365,
      }),
    );
    for (const secret of [TEST_API_KEY, TEST_SECRET, TEST_SECRET.slice(6)])
      expect(asTest.text).not.toContain(secret);
    // The live key sees the live integration: not configured, and none of the test offerings.
    const asLive = await t.call("GET", "/mgmt/v1/billing-integration");
    expect(asLive.body.data).toMatchObject({
      registered: false,
      mode: "live",
      status: "not_configured",
      offerings: [],
    });
  });

  test("the secrets are stored only encrypted", () => {
    const rows = t.deps.sqlite.query("SELECT * FROM billing_integrations").all();
    const text = JSON.stringify(rows);
    expect(rows.length).toBeGreaterThan(0);
    for (const secret of [TEST_API_KEY, TEST_SECRET, TEST_SECRET.slice(6)])
      expect(text).not.toContain(secret);
  });
});

describe("the webhook signature", () => {
  test("a delivery signed by Stripe's helper with the endpoint's secret is accepted", async () => {
    const response = await deliver(event("customer.created", { id: next("cus") }));
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({ result: "ignored", replayed: false });
  });

  const refusals: [string, (e: object) => Promise<Parameters<typeof deliver>[1]>, string][] = [
    [
      "signed with another secret",
      async () => ({ secret: `whsec_${randomBytes(24).toString("base64")}` }),
      "mismatch",
    ],
    ["without the header", async () => ({ signature: null }), "missing"],
    ["signed 301 seconds ago", async () => ({ timestamp: nowSec() - 301 }), "expired"],
    // 302, not 301: the clock is shared by the file and runs, and a second may tick over between
    // signing and the check (which would make 301 ahead read as 300, inside the window).
    ["signed 302 seconds in the future", async () => ({ timestamp: nowSec() + 302 }), "expired"],
    [
      "whose body was changed after signing",
      async (e) => {
        const signed = JSON.stringify(e);
        return {
          signature: await header(signed),
          payload: signed.replace('"livemode":false', '"livemode":false '),
        };
      },
      "mismatch",
    ],
    ["with a malformed header", async () => ({ signature: "t=abc,v1=zz" }), "malformed"],
    [
      "with only a v0 signature",
      async (e) => ({ signature: (await header(JSON.stringify(e))).replace("v1=", "v0=") }),
      "malformed",
    ],
  ];
  test.each(refusals)(
    "a delivery %s is a 400 with the error envelope and changes nothing",
    async (_name, make, reason) => {
      const price = offering();
      const e = event("checkout.session.completed", checkout(price));
      const before = storeDigest(t.deps.sqlite);
      const response = await deliver(e, await make(e));
      expect(response.status).toBe(400);
      expect(response.body.error).toMatchObject({ code: "BILLING_SIGNATURE_INVALID", details: { reason } });
      expect(response.body.error.request_id).toBe(response.headers.get("x-request-id"));
      expect(storeDigest(t.deps.sqlite)).toBe(before);
    },
  );

  test("one matching v1 signature among several is enough (a secret being rolled)", async () => {
    const e = event("customer.created", { id: next("cus") });
    const payload = JSON.stringify(e);
    const good = await header(payload);
    const wrong = (await header(payload, { secret: LIVE_SECRET })).split(",")[1];
    const response = await deliver(e, {
      payload,
      signature: `${good.split(",")[0]},${wrong},${good.split(",")[1]}`,
    });
    expect(response.status).toBe(200);
  });

  test("a correctly signed body that is not an event is a 400 and changes nothing", async () => {
    const before = storeDigest(t.deps.sqlite);
    for (const payload of ['{"hello":1}', '{"id":"evt_1","type":"x","livemode":"no","data":{"object":{}}}']) {
      const response = await deliver({}, { payload });
      expect(response.status).toBe(400);
      expect(response.body.error.code).toBe("INVALID_REQUEST");
    }
    expect(storeDigest(t.deps.sqlite)).toBe(before);
  });

  test("a body over 1 MiB is refused with 413 before anything is verified", async () => {
    const e = event("checkout.session.completed", {
      ...checkout(offering()),
      padding: "x".repeat(1_100_000),
    });
    const before = storeDigest(t.deps.sqlite);
    const response = await deliver(e);
    expect(response.status).toBe(413);
    expect(response.body.error.code).toBe("PAYLOAD_TOO_LARGE");
    expect(storeDigest(t.deps.sqlite)).toBe(before);
  });

  test("a live-mode event signed with the test secret is refused and changes nothing", async () => {
    const e = event("checkout.session.completed", checkout(offering()), true);
    const before = storeDigest(t.deps.sqlite);
    const response = await deliver(e);
    expect(response.status).toBe(400);
    expect(response.body.error.details.reason).toBe("mode_mismatch");
    expect(storeDigest(t.deps.sqlite)).toBe(before);
  });
});

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
    }
  });

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

describe("subscriptions", () => {
  const expiryOf = (sessionId: string) => licensesOfCheckout(sessionId)[0]?.expiresAt?.getTime();

  test("a paid invoice extends the license to the period's end plus a day's grace, once", async () => {
    const subscription = next("sub");
    const session = checkout(offering(ids.subscriptionPolicy), { subscription });
    await deliver(event("checkout.session.completed", session));
    const periodEnd = nowSec() + 40 * 86_400;
    const paid = event("invoice.paid", invoice(subscription, periodEnd));
    expect((await deliver(paid)).body.data.result).toBe("succeeded");
    expect(expiryOf(session.id)).toBe((periodEnd + RENEWAL_GRACE_SEC) * 1000);
    const [license] = licensesOfCheckout(session.id);
    expect(license?.version).toBe(2);
    // The same invoice as a second event type changes nothing; an older period never shortens.
    expect((await deliver(event("invoice.payment_succeeded", paid.data.object))).body.data.result).toBe(
      "ignored",
    );
    expect(
      (await deliver(event("invoice.paid", invoice(subscription, periodEnd - 86_400)))).body.data.result,
    ).toBe("ignored");
    expect(licensesOfCheckout(session.id)[0]?.version).toBe(2);
  });

  test("an invoice that arrives before its checkout still sets the license's expiry", async () => {
    const subscription = next("sub");
    const periodEnd = nowSec() + 31 * 86_400;
    expect((await deliver(event("invoice.paid", invoice(subscription, periodEnd)))).body.data).toMatchObject({
      result: "succeeded",
    });
    const session = checkout(offering(ids.subscriptionPolicy), { subscription });
    await deliver(event("checkout.session.completed", session));
    expect(expiryOf(session.id)).toBe((periodEnd + RENEWAL_GRACE_SEC) * 1000);
  });

  test("cancelling at period end expires the license then; deleting the subscription expires it now", async () => {
    const subscription = next("sub");
    const session = checkout(offering(ids.subscriptionPolicy), { subscription });
    await deliver(event("checkout.session.completed", session));
    const periodEnd = nowSec() + 40 * 86_400;
    expect((await deliver(event("invoice.paid", invoice(subscription, periodEnd)))).body.data.result).toBe(
      "succeeded",
    );
    const cancelled = {
      id: subscription,
      object: "subscription",
      status: "active",
      cancel_at_period_end: true,
      cancel_at: null,
      items: { object: "list", data: [{ id: "si_1", current_period_end: periodEnd }] },
    };
    expect((await deliver(event("customer.subscription.updated", cancelled))).body.data.result).toBe(
      "succeeded",
    );
    expect(expiryOf(session.id)).toBe(periodEnd * 1000);
    const license = licensesOfCheckout(session.id)[0];
    const active = await t.call("GET", `/mgmt/v1/licenses/${license?.id}`, { key: t.keys.test });
    expect(active.body.data.status).toBe("active");

    const endedAt = nowSec();
    const deleted = event("customer.subscription.deleted", {
      ...cancelled,
      status: "canceled",
      ended_at: endedAt,
    });
    expect((await deliver(deleted)).body.data.result).toBe("succeeded");
    expect(expiryOf(session.id)).toBe(endedAt * 1000);
    const expired = await t.call("GET", `/mgmt/v1/licenses/${license?.id}`, { key: t.keys.test });
    expect(expired.body.data.status).toBe("expired");
    const types = t.deps.db
      .select()
      .from(auditEvents)
      .where(eq(auditEvents.targetId, license?.id as string))
      .all()
      .map((row) => row.type);
    expect(types).toEqual([
      "license.created",
      "license.updated",
      "license.updated",
      "license.updated",
      "license.expired",
    ]);
  });
});

describe("subscription events out of order", () => {
  type SubscriptionEventType = "customer.subscription.updated" | "customer.subscription.deleted";
  const expiryOf = (sessionId: string) => licensesOfCheckout(sessionId)[0]?.expiresAt?.getTime();

  /** The subscription object in one state, as Stripe's 2025-03+ API shows it (period end on the items). */
  const state = (subscription: string, periodEnd: number, fields: Record<string, unknown> = {}) => ({
    id: subscription,
    object: "subscription",
    status: "active",
    cancel_at: null,
    cancel_at_period_end: false,
    items: { object: "list", data: [{ id: "si_1", current_period_end: periodEnd }] },
    ...fields,
  });

  /** An event Stripe created at `created` (provider time), whenever it is delivered. */
  const changeAt = (
    type: SubscriptionEventType,
    object: Record<string, unknown>,
    created: number,
    id = next("evt"),
  ) => ({ ...event(type, object), id, created });

  /** A bought subscription with its first period paid. */
  async function subscribed() {
    const subscription = next("sub");
    const session = checkout(offering(ids.subscriptionPolicy), { subscription });
    expect((await deliver(event("checkout.session.completed", session))).body.data.result).toBe("succeeded");
    const periodEnd = nowSec() + 40 * 86_400;
    expect((await deliver(event("invoice.paid", invoice(subscription, periodEnd)))).body.data.result).toBe(
      "succeeded",
    );
    expect(expiryOf(session.id)).toBe((periodEnd + RENEWAL_GRACE_SEC) * 1000);
    return { subscription, session, periodEnd };
  }

  const recorded = (eventId: string) =>
    t.deps.db.select().from(billingEvents).where(eq(billingEvents.eventId, eventId)).get();

  test("a cancellation delivered after the resumption that undid it is ignored as stale, and renewals keep extending the license", async () => {
    const { subscription, session, periodEnd } = await subscribed();
    const created = nowSec();
    const cancel = changeAt(
      "customer.subscription.updated",
      state(subscription, periodEnd, { cancel_at: periodEnd, cancel_at_period_end: true }),
      created,
    );
    const resume = changeAt("customer.subscription.updated", state(subscription, periodEnd), created + 120);
    expect((await deliver(resume)).status).toBe(200);
    const version = licensesOfCheckout(session.id)[0]?.version;

    const stale = await deliver(cancel);
    expect(stale.status).toBe(200);
    expect(stale.body.data).toEqual({ event_id: cancel.id, result: "ignored", replayed: false });
    expect(recorded(cancel.id)).toMatchObject({ result: "ignored", reason: "stale" });
    const status = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
    expect(status.body.data.last_event).toMatchObject({ id: cancel.id, result: "ignored", reason: "stale" });
    expect(expiryOf(session.id)).toBe((periodEnd + RENEWAL_GRACE_SEC) * 1000);
    expect(licensesOfCheckout(session.id)[0]?.version).toBe(version);

    // The customer keeps paying: each renewal moves the license on, as if the stale event never came.
    const nextEnd = periodEnd + 30 * 86_400;
    expect((await deliver(event("invoice.paid", invoice(subscription, nextEnd)))).body.data.result).toBe(
      "succeeded",
    );
    expect(expiryOf(session.id)).toBe((nextEnd + RENEWAL_GRACE_SEC) * 1000);
    // A replay of the stale event is still a 200 and still changes nothing.
    expect((await deliver(cancel)).body.data).toEqual({
      event_id: cancel.id,
      result: "ignored",
      replayed: true,
    });
    expect(expiryOf(session.id)).toBe((nextEnd + RENEWAL_GRACE_SEC) * 1000);
  });

  test("once the subscription is deleted, neither an older update delivered late nor a newer one revives the license", async () => {
    const { subscription, session, periodEnd } = await subscribed();
    const created = nowSec();
    const olderUpdate = changeAt("customer.subscription.updated", state(subscription, periodEnd), created);
    const endedAt = nowSec();
    const deleted = changeAt(
      "customer.subscription.deleted",
      state(subscription, periodEnd, { status: "canceled", ended_at: endedAt }),
      created + 60,
    );
    expect((await deliver(deleted)).body.data.result).toBe("succeeded");
    expect(expiryOf(session.id)).toBe(endedAt * 1000);
    const license = licensesOfCheckout(session.id)[0];

    const late = await deliver(olderUpdate);
    expect(late.status).toBe(200);
    expect(late.body.data.result).toBe("ignored");
    expect(recorded(olderUpdate.id)?.reason).toBe("stale");
    // Stripe lets a canceled subscription change only its cancellation details; whatever a later
    // update claims, the subscription has ended.
    const newer = changeAt("customer.subscription.updated", state(subscription, periodEnd), created + 120);
    expect((await deliver(newer)).body.data.result).toBe("ignored");
    expect(recorded(newer.id)?.reason).toBe("subscription_ended");
    // A late invoice records the payment but cannot reach past the end.
    await deliver(event("invoice.paid", invoice(subscription, periodEnd + 30 * 86_400)));

    expect(expiryOf(session.id)).toBe(endedAt * 1000);
    const managed = await t.call("GET", `/mgmt/v1/licenses/${license?.id}`, { key: t.keys.test });
    expect(managed.body.data.status).toBe("expired");
    expect(licensesOfCheckout(session.id)[0]?.version).toBe(license?.version);
  });

  test("a deletion delivered before an update Stripe created earlier still ends the subscription", async () => {
    const { subscription, session, periodEnd } = await subscribed();
    const created = nowSec();
    const endedAt = nowSec();
    const deleted = changeAt(
      "customer.subscription.deleted",
      state(subscription, periodEnd, { status: "canceled", ended_at: endedAt }),
      created,
    );
    // A cancellation-details edit made after the deletion, delivered first: it shows the end too.
    const edited = changeAt(
      "customer.subscription.updated",
      state(subscription, periodEnd, { status: "canceled", ended_at: endedAt, cancellation_details: {} }),
      created + 30,
    );
    expect((await deliver(edited)).body.data.result).toBe("succeeded");
    expect((await deliver(deleted)).status).toBe(200);
    expect(expiryOf(session.id)).toBe(endedAt * 1000);
  });

  // Stripe's order of five changes: cancel at A, resume, cancel at B, resume, cancel at period end.
  const orders = [
    [0, 1, 2, 3, 4],
    [4, 3, 2, 1, 0],
    [2, 4, 0, 3, 1],
    [1, 0, 3, 4, 2],
    [3, 4, 1, 2, 0],
  ].map((order) => [order.join(" "), order] as const);
  test.each(orders)(
    "five changes delivered in the order %s end in the state of the one Stripe made last",
    async (_name, order) => {
      const { subscription, session, periodEnd } = await subscribed();
      const created = nowSec();
      const states = [
        { cancel_at: periodEnd - 10 * 86_400 },
        {},
        { cancel_at: periodEnd - 5 * 86_400 },
        {},
        { cancel_at_period_end: true },
      ];
      const changes = states.map((fields, i) =>
        changeAt("customer.subscription.updated", state(subscription, periodEnd, fields), created + i * 10),
      );
      for (const i of order) {
        const change = changes[i] as (typeof changes)[number];
        expect((await deliver(change)).status).toBe(200);
      }
      expect(expiryOf(session.id)).toBe(periodEnd * 1000);
      const stale = changes.filter((change) => recorded(change.id)?.reason === "stale").length;
      // Every change delivered after a newer one was ignored, and only those.
      const expectedStale = order.filter((i, at) => order.slice(0, at).some((earlier) => earlier > i)).length;
      expect(stale).toBe(expectedStale);
    },
  );

  test("two changes made in the same second are settled by event id, whatever order they arrive in", async () => {
    const run = Date.now().toString(36);
    const outcomes: (number | undefined)[] = [];
    for (const [label, first] of [
      ["x", 0],
      ["y", 1],
    ] as const) {
      const { subscription, session, periodEnd } = await subscribed();
      const created = nowSec();
      const pair = [
        changeAt(
          "customer.subscription.updated",
          state(subscription, periodEnd, { cancel_at: periodEnd - 5 * 86_400 }),
          created,
          `evt_tie${run}${label}_1`,
        ),
        changeAt(
          "customer.subscription.updated",
          state(subscription, periodEnd),
          created,
          `evt_tie${run}${label}_2`,
        ),
      ];
      for (const change of first === 0 ? pair : [...pair].reverse()) await deliver(change);
      outcomes.push(expiryOf(session.id) === (periodEnd + RENEWAL_GRACE_SEC) * 1000 ? 1 : 0);
    }
    // Both subscriptions end in the state of the event with the greater id (the resumption).
    expect(outcomes).toEqual([1, 1]);
  });

  test("a subscription change without the event's created time is recorded as failed and changes nothing", async () => {
    const { subscription, session, periodEnd } = await subscribed();
    const { created: _created, ...withoutCreated } = changeAt(
      "customer.subscription.updated",
      state(subscription, periodEnd, { cancel_at: periodEnd - 5 * 86_400 }),
      nowSec(),
    );
    const response = await deliver(withoutCreated);
    expect(response.status).toBe(200);
    expect(response.body.data.result).toBe("failed");
    expect(recorded(withoutCreated.id)?.reason).toBe("malformed_event");
    expect(expiryOf(session.id)).toBe((periodEnd + RENEWAL_GRACE_SEC) * 1000);
  });
});

describe("the plan", () => {
  test("without billing_integration the status says not_entitled and deliveries are refused with 403, changing nothing", async () => {
    const price = offering();
    t.workspace.setPlan("personal");
    try {
      const status = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
      expect(status.body.data).toMatchObject({ registered: true, status: "not_entitled" });
      const before = storeDigest(t.deps.sqlite);
      const response = await deliver(event("checkout.session.completed", checkout(price)));
      expect(response.status).toBe(403);
      expect(response.body.error).toMatchObject({
        code: "PLAN_ENTITLEMENT_REQUIRED",
        details: { entitlement: "billing_integration" },
      });
      expect(storeDigest(t.deps.sqlite)).toBe(before);
      expect(() =>
        billing.addOffering(
          { priceId: "price_refused", productId: ids.product, policyId: ids.policy },
          ACTOR,
        ),
      ).toThrow();
    } finally {
      t.workspace.setPlan("self_hosted");
    }
  });
});

describe("both modes", () => {
  test("each event goes to the environment whose secret signed it, and only that environment sees it", async () => {
    const f = factories(t);
    const liveProduct = f.product({ environment: "live" });
    const livePolicy = f.policy({ productId: liveProduct.id, environment: "live" });
    billing.configure(
      { provider: "stripe", apiKey: LIVE_API_KEY, webhookSecret: LIVE_SECRET, secureClaims: true },
      ACTOR,
    );
    const price = `price_live${Date.now()}`;
    billing.addOffering({ priceId: price, productId: liveProduct.id, policyId: livePolicy.id }, ACTOR);
    const testLast = (await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test })).body.data
      .last_event;
    // The live price is unknown to the test integration: a test-mode event for it fails.
    const wrongMode = event("checkout.session.completed", checkout(price));
    expect((await deliver(wrongMode)).body.data.result).toBe("failed");

    const session = checkout(price);
    const e = event("checkout.session.completed", session, true);
    expect((await deliver(e, { secret: LIVE_SECRET })).body.data.result).toBe("succeeded");
    const [license] = licensesOfCheckout(session.id);
    expect(license?.environment).toBe("live");
    const live = (await t.call("GET", "/mgmt/v1/billing-integration")).body.data;
    expect(live).toMatchObject({
      registered: true,
      mode: "live",
      last_event: { id: e.id, result: "succeeded" },
    });
    expect(live.offerings.map((o: { billing_price_id: string }) => o.billing_price_id)).toEqual([price]);
    const test = (await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test })).body.data;
    expect(test.last_event.id).toBe(wrongMode.id);
    expect(test.last_event.id).not.toBe(testLast?.id);
    expect(JSON.stringify(test)).not.toContain(liveProduct.id);
  });
});

describe("over real HTTP", () => {
  test("a running server sees an integration configured through another connection at once, verifies the bytes as sent, applies the event once and answers a replay with 200", async () => {
    // Its own data directory: what the server sees depends on nothing the tests above left behind.
    const own = createTestContext();
    const ownBilling = new BillingService(own.deps, () => own.workspace.plan(), BASE_URL);
    const f = factories(own);
    const product = f.product({ environment: "test" });
    const policy = f.policy({ productId: product.id, environment: "test" });
    const server = serveTestStore(own);
    const sqlite = own.deps.sqlite;
    try {
      const price = `price_http${Date.now()}`;
      const session = checkout(price);
      // Stripe's own formatting: pretty-printed, so a server that re-serialised would not verify.
      const payload = JSON.stringify(event("checkout.session.completed", session), null, 2);
      const send = async () => {
        const response = await fetch(`${server.url}${WEBHOOK}`, {
          method: "POST",
          headers: {
            "content-type": "application/json; charset=utf-8",
            "stripe-signature": await header(payload, { timestamp: Math.floor(Date.now() / 1000) }),
          },
          body: payload,
        });
        return { status: response.status, body: (await response.json()) as Record<string, unknown> };
      };
      expect((await send()).status).toBe(404);
      // What `licensing billing configure` does while the server runs: writes through another connection.
      ownBilling.configure(
        { provider: "stripe", apiKey: TEST_API_KEY, webhookSecret: TEST_SECRET, secureClaims: true },
        ACTOR,
      );
      ownBilling.addOffering({ priceId: price, productId: product.id, policyId: policy.id }, ACTOR);
      // The status and body together, so a failure shows what the server answered.
      expect(await send()).toMatchObject({
        status: 200,
        body: { data: { result: "succeeded", replayed: false } },
      });
      // The server's mail worker sends the buyer's email in the background, 50-500 ms later: the
      // store is compared once it has, or that write would look like the replay's.
      const deadline = Date.now() + 10_000;
      const pending = () =>
        sqlite
          .query<{ n: number }, []>("SELECT count(*) AS n FROM mail_outbox WHERE status = 'pending'")
          .get()?.n;
      while (pending() !== 0 && Date.now() < deadline) await Bun.sleep(20);
      expect(
        sqlite
          .query<{ status: string }, [string]>("SELECT status FROM mail_outbox WHERE recipient = ?")
          .all(session.customer_details.email),
      ).toEqual([{ status: "sent" }]);
      const before = storeDigest(sqlite);
      expect(await send()).toMatchObject({
        status: 200,
        body: { data: { result: "succeeded", replayed: true } },
      });
      expect(storeDigest(sqlite)).toBe(before);
      const made = sqlite
        .query("SELECT id FROM licenses WHERE json_extract(metadata, '$.checkout_session_id') = ?")
        .all(session.id);
      expect(made).toHaveLength(1);
    } finally {
      await server.shutdown("test");
      own.close();
    }
  });
});
