import { describe, expect, test } from "bun:test";
import { eq } from "drizzle-orm";
import { RENEWAL_GRACE_SEC } from "../../src/modules/billing/subscriptions.ts";
import { billingEvents, billingSubscriptions } from "../../src/store/schema/index.ts";
import {
  ACTOR,
  billing,
  changeAt,
  checkout,
  deliver,
  event,
  ids,
  invoice,
  licensesOfCheckout,
  next,
  nowSec,
  offering,
  subscriptionState,
  t,
  useBillingContext,
} from "../support/billing.ts";
import { factories } from "../support/factories.ts";

/**
 * What limits the expiry subscription events may give a license, beyond what Stripe says: the
 * product being archived, the vendor holding the license's renewal authority, and the plan's
 * longest license.
 */
useBillingContext({ configured: true });

const DAY = 86_400;

const recorded = (eventId: string) =>
  t.deps.db.select().from(billingEvents).where(eq(billingEvents.eventId, eventId)).get();

/** A product of its own (so archiving it touches no other test) with a subscription sold and paid for. */
async function paidSubscription() {
  const f = factories(t);
  const product = f.product({ environment: "test" });
  const policy = f.policy({
    productId: product.id,
    environment: "test",
    licenseType: "subscription",
    billingCycle: "monthly",
  });
  const price = `price_limits${next("p").slice("p_".length)}`;
  billing.addOffering({ priceId: price, productId: product.id, policyId: policy.id }, ACTOR);
  const subscription = next("sub");
  const session = checkout(price, { subscription });
  expect((await deliver(event("checkout.session.completed", session))).body.data.result).toBe("succeeded");
  const periodEnd = nowSec() + 30 * DAY;
  expect((await deliver(event("invoice.paid", invoice(subscription, periodEnd)))).body.data.result).toBe(
    "succeeded",
  );
  const license = licensesOfCheckout(session.id)[0];
  if (!license) throw new Error("the checkout made no license");
  expect(license.expiresAt?.getTime()).toBe((periodEnd + RENEWAL_GRACE_SEC) * 1000);
  return { product, subscription, session, periodEnd, license };
}

const expiryOf = (sessionId: string) => licensesOfCheckout(sessionId)[0]?.expiresAt?.getTime();

describe("archived products", () => {
  test("a renewal or an undone cancellation leaves an archived product's license as it was (recorded as ignored), while a cancellation still ends it", async () => {
    const { product, subscription, session, periodEnd } = await paidSubscription();
    expect((await t.call("DELETE", `/mgmt/v1/products/${product.id}`, { key: t.keys.test })).status).toBe(
      204,
    );

    const renewal = event("invoice.paid", invoice(subscription, periodEnd + 30 * DAY));
    const refused = await deliver(renewal);
    expect([refused.status, refused.body.data.result]).toEqual([200, "ignored"]);
    expect(recorded(renewal.id)).toMatchObject({ result: "ignored", reason: "product_archived" });
    const status = await t.call("GET", "/mgmt/v1/billing-integration", { key: t.keys.test });
    expect(status.body.data.last_event).toMatchObject({ id: renewal.id, reason: "product_archived" });
    expect(expiryOf(session.id)).toBe((periodEnd + RENEWAL_GRACE_SEC) * 1000);

    // Taking time away stays allowed, as suspending and revoking do through the API.
    const created = nowSec();
    const cancel = subscriptionState(subscription, periodEnd, { cancel_at: periodEnd - 10 * DAY });
    const cancelled = await deliver(changeAt("customer.subscription.updated", cancel, created));
    expect(cancelled.body.data.result).toBe("succeeded");
    expect(expiryOf(session.id)).toBe((periodEnd - 10 * DAY) * 1000);

    const undo = changeAt(
      "customer.subscription.updated",
      subscriptionState(subscription, periodEnd),
      created + 10,
    );
    expect((await deliver(undo)).body.data.result).toBe("ignored");
    expect(recorded(undo.id)?.reason).toBe("product_archived");
    expect(expiryOf(session.id)).toBe((periodEnd - 10 * DAY) * 1000);
  });

  test("an end that comes after the vendor shortened the license is kept in the subscription's record, not refused as a lengthening", async () => {
    const { product, subscription, session, periodEnd, license } = await paidSubscription();
    const shortened = new Date((nowSec() + 2 * DAY) * 1000);
    const patched = await t.call("PATCH", `/mgmt/v1/licenses/${license.id}`, {
      key: t.keys.test,
      body: { expires_at: shortened.toISOString() },
    });
    expect(patched.status).toBe(200);
    expect((await t.call("DELETE", `/mgmt/v1/products/${product.id}`, { key: t.keys.test })).status).toBe(
      204,
    );
    const cancel = changeAt(
      "customer.subscription.updated",
      subscriptionState(subscription, periodEnd, { cancel_at_period_end: true }),
      nowSec(),
    );
    // The period's end is after the vendor's: the license keeps the earlier one.
    expect((await deliver(cancel)).body.data.result).toBe("ignored");
    expect(expiryOf(session.id)).toBe(shortened.getTime());
    const record = t.deps.db
      .select()
      .from(billingSubscriptions)
      .where(eq(billingSubscriptions.subscriptionId, subscription))
      .get();
    expect(record?.endsAt?.getTime()).toBe(periodEnd * 1000);
    expect(record?.stateEventId).toBe(cancel.id);
  });
});

describe("renewal authority", () => {
  test("while the vendor holds a license's renewal authority, subscription events are recorded as ignored and leave its expiry, and handing it back applies what the subscription grants", async () => {
    const { subscription, session, periodEnd, license } = await paidSubscription();
    const vendorExpiry = new Date((nowSec() + 365 * DAY) * 1000).toISOString();
    const taken = await t.call("PATCH", `/mgmt/v1/licenses/${license.id}`, {
      key: t.keys.test,
      body: { renewal_authority: "vendor", expires_at: vendorExpiry },
    });
    expect(taken.status).toBe(200);

    const cancel = changeAt(
      "customer.subscription.updated",
      subscriptionState(subscription, periodEnd, { cancel_at_period_end: true }),
      nowSec(),
    );
    const renewal = event("invoice.paid", invoice(subscription, periodEnd + 30 * DAY));
    for (const sent of [cancel, renewal]) {
      expect((await deliver(sent)).body.data.result).toBe("ignored");
      expect(recorded(sent.id)?.reason).toBe("vendor_renewal_authority");
    }
    expect(expiryOf(session.id)).toBe(Date.parse(vendorExpiry));

    // Handed back: paid through a second month, but set to cancel at the end of the first, so the
    // first's end holds, at once and after later events.
    const returned = await t.call("PATCH", `/mgmt/v1/licenses/${license.id}`, {
      key: t.keys.test,
      body: { renewal_authority: "external_billing" },
    });
    expect(returned.status).toBe(200);
    expect(returned.body.data.expires_at).toBe(new Date(periodEnd * 1000).toISOString());
    const later = event("invoice.paid", invoice(subscription, periodEnd + 60 * DAY));
    expect((await deliver(later)).body.data.result).toBe("ignored");
    expect(expiryOf(session.id)).toBe(periodEnd * 1000);
  });

  test("a subscription that ended while the vendor held the authority ends the license when it is handed back", async () => {
    const { subscription, session, periodEnd, license } = await paidSubscription();
    const vendorExpiry = new Date((nowSec() + 365 * DAY) * 1000).toISOString();
    await t.call("PATCH", `/mgmt/v1/licenses/${license.id}`, {
      key: t.keys.test,
      body: { renewal_authority: "vendor", expires_at: vendorExpiry },
    });
    const endedAt = nowSec() - 60;
    const deleted = changeAt(
      "customer.subscription.deleted",
      subscriptionState(subscription, periodEnd, { status: "canceled", ended_at: endedAt }),
      nowSec(),
    );
    expect((await deliver(deleted)).body.data.result).toBe("ignored");
    expect(expiryOf(session.id)).toBe(Date.parse(vendorExpiry));
    // No event comes after a deletion: handing the authority back is what applies it.
    const returned = await t.call("PATCH", `/mgmt/v1/licenses/${license.id}`, {
      key: t.keys.test,
      body: { renewal_authority: "external_billing" },
    });
    expect(returned.status).toBe(200);
    expect(returned.body.data.status).toBe("expired");
    expect(expiryOf(session.id)).toBe(endedAt * 1000);
  });

  test("handing the authority back with an expires_at of the vendor's own keeps that one", async () => {
    const { session, license } = await paidSubscription();
    await t.call("PATCH", `/mgmt/v1/licenses/${license.id}`, {
      key: t.keys.test,
      body: { renewal_authority: "vendor" },
    });
    const own = new Date((nowSec() + 90 * DAY) * 1000).toISOString();
    const returned = await t.call("PATCH", `/mgmt/v1/licenses/${license.id}`, {
      key: t.keys.test,
      body: { renewal_authority: "external_billing", expires_at: own },
    });
    expect(returned.status).toBe(200);
    expect(expiryOf(session.id)).toBe(Date.parse(own));
  });
});

describe("the plan's longest license", () => {
  test("an invoice paying through the year 9999 gives the license the plan's longest duration whichever of checkout and invoice comes first", async () => {
    const price = offering(ids.subscriptionPolicy);
    const now = t.clock.freeze();
    try {
      const longest = now.getTime() + t.workspace.plan().license_duration_max_sec * 1000;
      // The last period end Stripe's times may have: the end of 9999-12-29.
      const periodEnd = 253_402_214_399 - DAY;
      for (const invoiceFirst of [false, true]) {
        const subscription = next("sub");
        const session = checkout(price, { subscription });
        const sent = [
          event("checkout.session.completed", session),
          event("invoice.paid", invoice(subscription, periodEnd)),
        ];
        for (const e of invoiceFirst ? sent.reverse() : sent) {
          expect((await deliver(e)).body.data.result).toBe("succeeded");
        }
        expect({ invoiceFirst, expiry: expiryOf(session.id) }).toEqual({ invoiceFirst, expiry: longest });
      }
    } finally {
      t.clock.resume();
    }
  });
});
