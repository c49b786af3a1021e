import { describe, expect, test } from "bun:test";
import { and, eq } from "drizzle-orm";
import { RENEWAL_GRACE_SEC } from "../../src/modules/billing/subscriptions.ts";
import { auditEvents } from "../../src/store/schema/index.ts";
import {
  ACTOR,
  billing,
  changeAt,
  checkout,
  deliver,
  event,
  invoice,
  licensesOfCheckout,
  next,
  nowSec,
  subscriptionState,
  t,
  useBillingContext,
} from "../support/billing.ts";
import { factories } from "../support/factories.ts";

/**
 * What a subscription's price says about its license: a move to another offering of the same
 * product moves the license to that offering's policy; a price no offering of the product maps
 * (none at all, another product's) renews nothing and is recorded as failed.
 */
useBillingContext({ configured: true });

const DAY = 86_400;

/** An invoice as Stripe's 2025-03+ API shows it: each line's price under `pricing.price_details`. */
function pricedInvoice(subscription: string, periodEnd: number, prices: string[], fields = {}) {
  return {
    ...invoice(subscription, periodEnd),
    lines: {
      object: "list",
      data: prices.map((price) => ({
        id: next("il"),
        period: { start: periodEnd - 30 * DAY, end: periodEnd },
        pricing: { type: "price_details", price_details: { price, product: "prod_stripe" } },
        ...fields,
      })),
    },
  };
}

/** A subscription whose one item has this price (expanded, as subscription events carry it). */
const pricedState = (subscription: string, periodEnd: number, price: string, fields = {}) =>
  subscriptionState(subscription, periodEnd, {
    items: { object: "list", data: [{ id: "si_1", current_period_end: periodEnd, price: { id: price } }] },
    ...fields,
  });

let priceCounter = 0;
const newPrice = () => `price_plan${Date.now()}x${++priceCounter}`;

/** A product of its own with a Pro and a Basic subscription offering, and a Pro subscription paid for a month. */
async function proSubscriber() {
  const f = factories(t);
  const product = f.product({ environment: "test" });
  const policyOf = (name: string, licenseType: "subscription" | "perpetual" = "subscription") =>
    f.policy({ productId: product.id, environment: "test", name, licenseType, billingCycle: "monthly" });
  const pro = policyOf("Pro");
  const basic = policyOf("Basic");
  const prices = { pro: newPrice(), basic: newPrice() };
  billing.addOffering({ priceId: prices.pro, productId: product.id, policyId: pro.id }, ACTOR);
  const basicOffering = billing.addOffering(
    { priceId: prices.basic, productId: product.id, policyId: basic.id },
    ACTOR,
  );
  const subscription = next("sub");
  const session = checkout(prices.pro, { subscription });
  expect((await deliver(event("checkout.session.completed", session))).body.data.result).toBe("succeeded");
  const periodEnd = nowSec() + 30 * DAY;
  const paid = await deliver(event("invoice.paid", pricedInvoice(subscription, periodEnd, [prices.pro])));
  expect(paid.body.data.result).toBe("succeeded");
  const license = () => {
    const [row] = licensesOfCheckout(session.id);
    if (!row) throw new Error("the checkout made no license");
    return row;
  };
  expect(license().policyId).toBe(pro.id);
  return {
    f,
    product,
    pro,
    basic,
    basicOffering,
    prices,
    subscription,
    session,
    periodEnd,
    license,
    policyOf,
  };
}

const lastEvent = () => billing.status("test").last_event;

describe("a price of another offering of the same product", () => {
  test("a downgrade moves the license to the new offering's policy, audited as the billing provider's change, and its invoices renew it", async () => {
    const { basic, pro, basicOffering, prices, subscription, periodEnd, license } = await proSubscriber();
    const before = license();
    const downgrade = changeAt(
      "customer.subscription.updated",
      pricedState(subscription, periodEnd, prices.basic),
      nowSec() + 5,
    );
    expect((await deliver(downgrade)).body.data.result).toBe("succeeded");
    const moved = license();
    expect(moved.policyId).toBe(basic.id);
    expect(moved.metadata.billing_offering_id).toBe(basicOffering.id);
    expect(moved.expiresAt?.getTime()).toBe(before.expiresAt?.getTime());
    expect(moved.version).toBe(before.version + 1);
    const audit = t.deps.db
      .select()
      .from(auditEvents)
      .where(and(eq(auditEvents.targetId, moved.id), eq(auditEvents.type, "license.updated")))
      .all()
      .at(-1);
    expect(audit?.actor).toEqual({ type: "billing", id: "stripe" });
    expect(audit?.data).toMatchObject({
      changes: ["policy_id", "metadata"],
      billing_event_id: downgrade.id,
      from_policy_id: pro.id,
      to_policy_id: basic.id,
      billing_offering_id: basicOffering.id,
    });

    const nextEnd = periodEnd + 30 * DAY;
    const renewal = await deliver(
      event("invoice.paid", pricedInvoice(subscription, nextEnd, [prices.basic])),
    );
    expect(renewal.body.data.result).toBe("succeeded");
    expect(license().expiresAt?.getTime()).toBe((nextEnd + RENEWAL_GRACE_SEC) * 1000);
    expect(license().policyId).toBe(basic.id);
  });

  test("a paid invoice for the new price moves the license even when no subscription event says so", async () => {
    const { basic, prices, subscription, periodEnd, license } = await proSubscriber();
    const nextEnd = periodEnd + 30 * DAY;
    const renewal = await deliver(
      event("invoice.paid", pricedInvoice(subscription, nextEnd, [prices.basic])),
    );
    expect(renewal.body.data.result).toBe("succeeded");
    expect(license().policyId).toBe(basic.id);
    expect(license().expiresAt?.getTime()).toBe((nextEnd + RENEWAL_GRACE_SEC) * 1000);
  });

  test("an invoice made before the change, delivered after it, renews nothing back: the license keeps the new policy", async () => {
    const { basic, prices, subscription, periodEnd, license } = await proSubscriber();
    const madeBefore = nowSec();
    const lateOldInvoice = {
      ...event("invoice.paid", pricedInvoice(subscription, periodEnd, [prices.pro])),
      created: madeBefore,
    };
    await deliver(
      changeAt(
        "customer.subscription.updated",
        pricedState(subscription, periodEnd, prices.basic),
        madeBefore + 60,
      ),
    );
    expect(license().policyId).toBe(basic.id);
    await deliver(lateOldInvoice);
    expect(license().policyId).toBe(basic.id);
  });

  test("proration lines bill the old and the new price together; they decide nothing and fail nothing", async () => {
    const { pro, prices, subscription, periodEnd, license } = await proSubscriber();
    const proration = pricedInvoice(subscription, periodEnd, [prices.pro, prices.basic], {
      parent: { type: "subscription_item_details", subscription_item_details: { proration: true } },
    });
    const delivered = await deliver(event("invoice.paid", proration));
    expect(delivered.body.data.result).toBe("ignored");
    expect(license().policyId).toBe(pro.id);
  });

  test("a price whose offering was removed keeps renewing the licenses on its policy, but moves none to it", async () => {
    const { pro, prices, subscription, periodEnd, license } = await proSubscriber();
    billing.removeOffering(prices.pro, ACTOR);
    const nextEnd = periodEnd + 30 * DAY;
    expect(
      (await deliver(event("invoice.paid", pricedInvoice(subscription, nextEnd, [prices.pro])))).body.data
        .result,
    ).toBe("succeeded");
    expect(license().expiresAt?.getTime()).toBe((nextEnd + RENEWAL_GRACE_SEC) * 1000);
    expect(license().policyId).toBe(pro.id);

    billing.removeOffering(prices.basic, ACTOR);
    const expiry = license().expiresAt?.getTime();
    const toRemoved = await deliver(
      event("invoice.paid", pricedInvoice(subscription, nextEnd + 30 * DAY, [prices.basic])),
    );
    expect(toRemoved.body.data.result).toBe("failed");
    expect(lastEvent()?.reason).toBe("unknown_price");
    expect(license().expiresAt?.getTime()).toBe(expiry);
    expect(license().policyId).toBe(pro.id);
  });

  test("a move to a retired policy, or to another kind of license, is refused and renews nothing", async () => {
    const { f, product, pro, subscription, periodEnd, license, policyOf } = await proSubscriber();
    const retired = f.policy({ productId: product.id, environment: "test", licenseType: "subscription" });
    const retiredPrice = newPrice();
    billing.addOffering({ priceId: retiredPrice, productId: product.id, policyId: retired.id }, ACTOR);
    t.deps.sqlite.query("UPDATE policies SET status = 'retired' WHERE id = ?").run(retired.id);
    const perpetual = policyOf("Lifetime", "perpetual");
    const perpetualPrice = newPrice();
    billing.addOffering({ priceId: perpetualPrice, productId: product.id, policyId: perpetual.id }, ACTOR);
    const expiry = license().expiresAt?.getTime();
    for (const [price, reason] of [
      [retiredPrice, "policy_retired"],
      [perpetualPrice, "license_type_changed"],
    ] as const) {
      const renewal = await deliver(
        event("invoice.paid", pricedInvoice(subscription, periodEnd + 30 * DAY, [price])),
      );
      expect(renewal.body.data.result).toBe("failed");
      expect(lastEvent()?.reason).toBe(reason);
      expect(license().expiresAt?.getTime()).toBe(expiry);
      expect(license().policyId).toBe(pro.id);
    }
  });

  test("an archived product's license keeps its policy when the price changes, as it takes no new terms", async () => {
    const { product, pro, prices, subscription, periodEnd, license } = await proSubscriber();
    expect((await t.call("DELETE", `/mgmt/v1/products/${product.id}`, { key: t.keys.test })).status).toBe(
      204,
    );
    const downgrade = await deliver(
      changeAt(
        "customer.subscription.updated",
        pricedState(subscription, periodEnd, prices.basic),
        nowSec() + 5,
      ),
    );
    expect(downgrade.body.data.result).toBe("ignored");
    expect(lastEvent()?.reason).toBe("product_archived");
    expect(license().policyId).toBe(pro.id);
  });
});

describe("a price no offering of the product maps", () => {
  test("an invoice for an unmapped price is failed and renews nothing, until an offering maps it and the event is sent again", async () => {
    const { f, product, subscription, periodEnd, license } = await proSubscriber();
    const before = license();
    const unresolvedBefore = billing.status("test").unresolved_failures;
    const unmapped = newPrice();
    const yearly = event("invoice.paid", pricedInvoice(subscription, periodEnd + 365 * DAY, [unmapped]));
    expect((await deliver(yearly)).body.data.result).toBe("failed");
    expect(lastEvent()).toMatchObject({ id: yearly.id, result: "failed", reason: "unknown_price" });
    expect(license().expiresAt?.getTime()).toBe(before.expiresAt?.getTime());
    expect(license().version).toBe(before.version);
    // Visible as every failed event is: kept as the last failure and audited for the vendor.
    expect(billing.status("test")).toMatchObject({
      last_failure: { id: yearly.id, reason: "unknown_price", resolved_at: null },
      unresolved_failures: unresolvedBefore + 1,
    });
    const failures = t.deps.db
      .select()
      .from(auditEvents)
      .where(and(eq(auditEvents.type, "billing_event.failed"), eq(auditEvents.environment, "test")))
      .all();
    expect(failures.map((row) => (row.data as { reason?: string }).reason)).toContain("unknown_price");

    const policy = f.policy({ productId: product.id, environment: "test", licenseType: "subscription" });
    billing.addOffering({ priceId: unmapped, productId: product.id, policyId: policy.id }, ACTOR);
    expect((await deliver(yearly)).body.data.result).toBe("succeeded");
    expect(billing.status("test")).toMatchObject({ unresolved_failures: unresolvedBefore });
    expect(billing.status("test").last_failure?.resolved_at).toEqual(expect.any(String));
    expect(license().policyId).toBe(policy.id);
    expect(license().expiresAt?.getTime()).toBe((periodEnd + 365 * DAY + RENEWAL_GRACE_SEC) * 1000);
  });

  test("an invoice for another product's price is failed and neither renews nor moves the license", async () => {
    const { f, pro, subscription, periodEnd, license } = await proSubscriber();
    const other = f.product({ environment: "test" });
    const otherPolicy = f.policy({ productId: other.id, environment: "test", licenseType: "subscription" });
    const otherPrice = newPrice();
    billing.addOffering({ priceId: otherPrice, productId: other.id, policyId: otherPolicy.id }, ACTOR);
    const expiry = license().expiresAt?.getTime();
    const yearly = await deliver(
      event("invoice.paid", pricedInvoice(subscription, periodEnd + 365 * DAY, [otherPrice])),
    );
    expect(yearly.body.data.result).toBe("failed");
    expect(lastEvent()?.reason).toBe("other_product_price");
    expect(license().expiresAt?.getTime()).toBe(expiry);
    expect(license().policyId).toBe(pro.id);
  });

  test("lines of two of the product's policies are ambiguous and renew nothing; an unmapped add-on beside the product's price is passed over", async () => {
    const { prices, subscription, periodEnd, license } = await proSubscriber();
    const expiry = license().expiresAt?.getTime();
    const both = await deliver(
      event("invoice.paid", pricedInvoice(subscription, periodEnd + 30 * DAY, [prices.pro, prices.basic])),
    );
    expect(both.body.data.result).toBe("failed");
    expect(lastEvent()?.reason).toBe("ambiguous_price");
    expect(license().expiresAt?.getTime()).toBe(expiry);

    const nextEnd = periodEnd + 30 * DAY;
    const withAddOn = await deliver(
      event("invoice.paid", pricedInvoice(subscription, nextEnd, [newPrice(), prices.pro])),
    );
    expect(withAddOn.body.data.result).toBe("succeeded");
    expect(license().expiresAt?.getTime()).toBe((nextEnd + RENEWAL_GRACE_SEC) * 1000);
  });

  test("a subscription moved to an unmapped price is failed and keeps its policy, while a cancellation in the same change still ends the license early", async () => {
    const { pro, subscription, periodEnd, license } = await proSubscriber();
    const unmapped = newPrice();
    const before = license();
    const moved = await deliver(
      changeAt("customer.subscription.updated", pricedState(subscription, periodEnd, unmapped), nowSec() + 1),
    );
    expect(moved.body.data.result).toBe("failed");
    expect(lastEvent()?.reason).toBe("unknown_price");
    expect(license().policyId).toBe(pro.id);
    expect(license().version).toBe(before.version);

    const cancelAt = nowSec() + 10 * DAY;
    const cancelled = await deliver(
      changeAt(
        "customer.subscription.updated",
        pricedState(subscription, periodEnd, unmapped, { cancel_at: cancelAt }),
        nowSec() + 2,
      ),
    );
    expect(cancelled.body.data.result).toBe("failed");
    expect(license().expiresAt?.getTime()).toBe(cancelAt * 1000);
    expect(license().policyId).toBe(pro.id);
  });

  test("an invoice for an unmapped price that comes before its checkout is failed and gives the license no time", async () => {
    const subscription = next("sub");
    const { basic, prices } = await proSubscriber();
    const early = await deliver(
      event("invoice.paid", pricedInvoice(subscription, nowSec() + 365 * DAY, [newPrice()])),
    );
    expect(early.body.data.result).toBe("failed");
    expect(lastEvent()?.reason).toBe("unknown_price");
    const session = checkout(prices.basic, { subscription });
    await deliver(event("checkout.session.completed", session));
    const [license] = licensesOfCheckout(session.id);
    expect(license?.policyId).toBe(basic.id);
    expect(license?.expiresAt?.getTime()).toBeLessThan((nowSec() + 60 * DAY) * 1000);
  });
});
