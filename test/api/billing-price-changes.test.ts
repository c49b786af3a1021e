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

  test("a price re-pointed at another policy (its offering removed, a new one added) keeps renewing the licenses sold before on their policy, and sells the new one", async () => {
    const { product, policyOf, pro, prices, subscription, periodEnd, license } = await proSubscriber();
    const proPlus = policyOf("Pro Plus");
    billing.removeOffering(prices.pro, ACTOR);
    const repointed = billing.addOffering(
      { priceId: prices.pro, productId: product.id, policyId: proPlus.id },
      ACTOR,
    );

    const nextEnd = periodEnd + 30 * DAY;
    const renewal = await deliver(event("invoice.paid", pricedInvoice(subscription, nextEnd, [prices.pro])));
    expect(renewal.body.data.result).toBe("succeeded");
    expect(license().policyId).toBe(pro.id);
    expect(license().expiresAt?.getTime()).toBe((nextEnd + RENEWAL_GRACE_SEC) * 1000);
    const update = await deliver(
      changeAt("customer.subscription.updated", pricedState(subscription, nextEnd, prices.pro), nowSec() + 5),
    );
    expect(update.body.data.result).toBe("ignored");
    expect(license().policyId).toBe(pro.id);

    const newcomer = checkout(prices.pro, { subscription: next("sub") });
    expect((await deliver(event("checkout.session.completed", newcomer))).body.data.result).toBe("succeeded");
    const [sold] = licensesOfCheckout(newcomer.id);
    expect(sold?.policyId).toBe(proPlus.id);
    expect(sold?.metadata.billing_offering_id).toBe(repointed.id);
  });

  test("a subscription with a price of the license's own policy and one of another (an add-on) keeps the license on its own", async () => {
    const { pro, prices, subscription, periodEnd, license } = await proSubscriber();
    const nextEnd = periodEnd + 30 * DAY;
    const renewal = await deliver(
      event("invoice.paid", pricedInvoice(subscription, nextEnd, [prices.basic, prices.pro])),
    );
    expect(renewal.body.data.result).toBe("succeeded");
    expect(license().policyId).toBe(pro.id);
    expect(license().expiresAt?.getTime()).toBe((nextEnd + RENEWAL_GRACE_SEC) * 1000);
    const withAddOn = subscriptionState(subscription, nextEnd, {
      items: {
        object: "list",
        data: [prices.pro, prices.basic].map((price, i) => ({
          id: `si_${i}`,
          current_period_end: nextEnd,
          price: { id: price },
        })),
      },
    });
    const update = await deliver(changeAt("customer.subscription.updated", withAddOn, nowSec() + 5));
    expect(update.body.data.result).not.toBe("failed");
    expect(license().policyId).toBe(pro.id);
  });

  test("a move to a policy that identifies, validates or counts devices another way is refused as policy_incompatible and renews nothing", async () => {
    const { f, product, pro, subscription, periodEnd, license } = await proSubscriber();
    const expiry = license().expiresAt?.getTime();
    const differences = [
      { identityMode: "named_user" },
      { validationMode: "hybrid" },
      { concurrencyUnit: "instance" },
    ] as const;
    for (const difference of differences) {
      const other = f.policy({
        productId: product.id,
        environment: "test",
        licenseType: "subscription",
        billingCycle: "monthly",
        ...difference,
      });
      const price = newPrice();
      billing.addOffering({ priceId: price, productId: product.id, policyId: other.id }, ACTOR);
      const renewal = await deliver(
        event("invoice.paid", pricedInvoice(subscription, periodEnd + 30 * DAY, [price])),
      );
      expect(renewal.body.data.result).toBe("failed");
      expect(lastEvent()?.reason).toBe("policy_incompatible");
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

  test("lines of two other policies of the product are ambiguous and renew nothing; an unmapped add-on beside the product's price is passed over", async () => {
    const { product, policyOf, prices, subscription, periodEnd, license } = await proSubscriber();
    const team = policyOf("Team");
    const teamPrice = newPrice();
    billing.addOffering({ priceId: teamPrice, productId: product.id, policyId: team.id }, ACTOR);
    const expiry = license().expiresAt?.getTime();
    const both = await deliver(
      event("invoice.paid", pricedInvoice(subscription, periodEnd + 30 * DAY, [teamPrice, prices.basic])),
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

describe("an invoice whose price would be refused, when the price cannot matter", () => {
  test("for a revoked license it is ignored as license_revoked, not a failure to fix", async () => {
    const { subscription, periodEnd, license } = await proSubscriber();
    const revoked = await t.call("DELETE", `/mgmt/v1/licenses/${license().id}`, { key: t.keys.test });
    expect(revoked.status).toBe(204);
    const before = billing.status("test");
    const sent = event("invoice.paid", pricedInvoice(subscription, periodEnd + 30 * DAY, [newPrice()]));
    expect((await deliver(sent)).body.data.result).toBe("ignored");
    expect(lastEvent()?.reason).toBe("license_revoked");
    const after = billing.status("test");
    expect(after.unresolved_failures).toBe(before.unresolved_failures);
    expect(after.last_failure?.id).toBe(before.last_failure?.id);
  });

  test("for a license the vendor renews it is ignored, and its period is still granted once the authority is handed back", async () => {
    const { subscription, periodEnd, license } = await proSubscriber();
    const id = license().id;
    const vendorExpiry = new Date((nowSec() + 10 * DAY) * 1000).toISOString();
    const taken = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, {
      key: t.keys.test,
      body: { renewal_authority: "vendor", expires_at: vendorExpiry },
    });
    expect(taken.status).toBe(200);
    const before = billing.status("test").unresolved_failures;
    const nextEnd = periodEnd + 30 * DAY;
    const sent = event("invoice.paid", pricedInvoice(subscription, nextEnd, [newPrice()]));
    expect((await deliver(sent)).body.data.result).toBe("ignored");
    expect(lastEvent()?.reason).toBe("vendor_renewal_authority");
    expect(billing.status("test").unresolved_failures).toBe(before);
    expect(license().expiresAt?.toISOString()).toBe(vendorExpiry);

    const returned = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, {
      key: t.keys.test,
      body: { renewal_authority: "external_billing" },
    });
    expect(returned.status).toBe(200);
    expect(returned.body.data.expires_at).toBe(new Date((nextEnd + RENEWAL_GRACE_SEC) * 1000).toISOString());
  });

  test("for a period a later invoice already paid it is ignored as period_already_paid: it grants nothing and no resend could change that", async () => {
    const { subscription, periodEnd, license } = await proSubscriber();
    const before = license();
    const unresolved = billing.status("test").unresolved_failures;
    const late = event("invoice.paid", pricedInvoice(subscription, periodEnd - 30 * DAY, [newPrice()]));
    expect((await deliver(late)).body.data.result).toBe("ignored");
    expect(lastEvent()?.reason).toBe("period_already_paid");
    expect(billing.status("test").unresolved_failures).toBe(unresolved);
    expect(license().version).toBe(before.version);
    expect(license().expiresAt?.getTime()).toBe(before.expiresAt?.getTime());
  });
});
