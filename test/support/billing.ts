import { afterAll, beforeAll } from "bun:test";
import { randomBytes } from "node:crypto";
import { sql } from "drizzle-orm";
import Stripe from "stripe";
import { unixSeconds } from "../../src/domain/clock.ts";
import type { Logger } from "../../src/http/logger.ts";
import { BillingService } from "../../src/modules/billing/service.ts";
import { licenses } from "../../src/store/schema/index.ts";
import { factories } from "./factories.ts";
import { BASE_URL, createTestContext, type TestContext } from "./harness.ts";

/**
 * What the billing suites share: a store with a product and two policies (one for subscriptions),
 * the billing service over it, and Stripe events signed by Stripe's own library
 * (`stripe.webhooks.generateTestHeaderString`) and delivered to the webhook.
 */
const stripe = new Stripe("sk_test_only_for_the_signing_helper");
// Under Bun the package signs with WebCrypto, which is asynchronous only: hence the Async helper.
export const WEBHOOK = "/billing/v1/stripe/webhook";
export const TEST_SECRET = `whsec_${randomBytes(24).toString("base64")}`;
export const LIVE_SECRET = `whsec_${randomBytes(24).toString("base64")}`;
export const TEST_API_KEY = `rk_test_${randomBytes(24).toString("hex")}`;
export const LIVE_API_KEY = `rk_live_${randomBytes(24).toString("hex")}`;
export const ACTOR = { type: "cli", id: "test" } as const;

// Set by each file's beforeAll (see useBillingContext); read through these live bindings.
export let t: TestContext;
export let billing: BillingService;
export let ids: { product: string; policy: string; subscriptionPolicy: string };
let counter = 0;
export const next = (prefix: string) =>
  `${prefix}_${Date.now().toString(36)}${(++counter).toString().padStart(4, "0")}`;

/**
 * Gives the calling test file its own store (made before its tests, closed after them). With
 * `configured`, the test integration is set up as well, as `configureTest()` leaves it; without,
 * the file starts from no integration at all. `logger` receives the app's log lines.
 */
export function useBillingContext(options: { configured?: boolean; logger?: Logger } = {}) {
  beforeAll(() => {
    t = createTestContext({ logger: options.logger });
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
    if (options.configured) configureTest();
  });
  afterAll(() => t.close());
}

export const nowSec = () => unixSeconds(t.clock.now());

export function header(
  payload: string,
  options: { secret?: string; timestamp?: number } = {},
): Promise<string> {
  return stripe.webhooks.generateTestHeaderStringAsync({
    payload,
    secret: options.secret ?? TEST_SECRET,
    timestamp: options.timestamp ?? nowSec(),
  });
}

export async function deliver(
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

export const event = (type: string, object: Record<string, unknown>, livemode = false) => ({
  id: next("evt"),
  object: "event",
  api_version: "2025-03-31.basil",
  created: nowSec(),
  livemode,
  type,
  data: { object },
});

export function checkout(
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

export const invoice = (subscription: string, periodEnd: number) => ({
  id: next("in"),
  object: "invoice",
  status: "paid",
  parent: { type: "subscription_details", subscription_details: { subscription } },
  lines: {
    object: "list",
    data: [{ id: next("il"), period: { start: periodEnd - 30 * 86_400, end: periodEnd } }],
  },
});

/** A subscription in one state, as Stripe's 2025-03+ API shows it (period end on the items). */
export const subscriptionState = (
  subscription: string,
  periodEnd: number,
  fields: Record<string, unknown> = {},
) => ({
  id: subscription,
  object: "subscription",
  status: "active",
  cancel_at: null,
  cancel_at_period_end: false,
  items: { object: "list", data: [{ id: "si_1", current_period_end: periodEnd }] },
  ...fields,
});

/** A subscription event Stripe created at `created` (provider time), whenever it is delivered. */
export const changeAt = (
  type: "customer.subscription.updated" | "customer.subscription.deleted",
  object: Record<string, unknown>,
  created: number,
  id = next("evt"),
) => ({ ...event(type, object), id, created });

export const licensesOfCheckout = (sessionId: string) =>
  t.deps.db
    .select()
    .from(licenses)
    .where(sql`json_extract(${licenses.metadata}, '$.checkout_session_id') = ${sessionId}`)
    .all();

export function configureTest(options: { secureClaims?: boolean } = {}) {
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
export function offering(policy = ids.policy, extra: { licenseDurationDays?: number } = {}) {
  const price = `price_${Date.now()}x${++priceCounter}`;
  billing.addOffering({ priceId: price, productId: ids.product, policyId: policy, ...extra }, ACTOR);
  return price;
}
