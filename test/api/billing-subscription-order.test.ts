import { describe, expect, test } from "bun:test";
import { RENEWAL_GRACE_SEC } from "../../src/modules/billing/subscriptions.ts";
import {
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
 * The same events about one subscription, delivered in every order Stripe might deliver them, end
 * in the same license expiry: once a paid invoice is known the license runs to the paid period plus
 * grace, before that the checkout's starting expiry holds, and a cancellation only ever cuts short.
 */
useBillingContext({ configured: true });

const DAY = 86_400;

function orders<T>(items: T[]): T[][] {
  if (items.length <= 1) return [items];
  return items.flatMap((item, i) =>
    orders([...items.slice(0, i), ...items.slice(i + 1)]).map((rest) => [item, ...rest]),
  );
}

type Story = (subscription: string) => { session: ReturnType<typeof checkout>; events: object[] };

/**
 * Tells one subscription's story once per order of its events, each time with a new subscription;
 * answers each order's final expiry by the order's name ("2 0 1": the third event first).
 */
async function expiryByOrder(story: Story): Promise<Record<string, number | null>> {
  const { events } = story(next("sub"));
  const found: Record<string, number | null> = {};
  for (const order of orders(events.map((_, i) => i))) {
    const { session, events: told } = story(next("sub"));
    for (const i of order) expect((await deliver(told[i] as object)).status).toBe(200);
    const licenses = licensesOfCheckout(session.id);
    expect(licenses).toHaveLength(1);
    found[order.join(" ")] = licenses[0]?.expiresAt?.getTime() ?? null;
  }
  return found;
}

let yearly: string | undefined;
/** A subscription policy billed yearly: a year's starting expiry, longer than the month paid. */
const yearlyPolicy = () => {
  yearly ??= factories(t).policy({
    productId: ids.product,
    environment: "test",
    licenseType: "subscription",
    billingCycle: "yearly",
  }).id;
  return yearly;
};

/** What every order should end in. */
const everyOrder = (count: number, expiry: number | null) =>
  Object.fromEntries(orders([...Array(count).keys()]).map((order) => [order.join(" "), expiry]));

describe("the delivery order does not decide a subscription license's expiry", () => {
  test("a checkout, its first paid invoice and a cancellation two years out end at the paid period plus grace in every delivery order", async () => {
    // A year's starting expiry (the policy's default), a month paid, a cancellation later than both.
    const price = offering(yearlyPolicy());
    const periodEnd = nowSec() + 30 * DAY;
    const expiries = await expiryByOrder((subscription) => {
      const session = checkout(price, { subscription });
      const cancelAt = subscriptionState(subscription, periodEnd, { cancel_at: nowSec() + 730 * DAY });
      return {
        session,
        events: [
          event("checkout.session.completed", session),
          event("invoice.paid", invoice(subscription, periodEnd)),
          changeAt("customer.subscription.updated", cancelAt, nowSec()),
        ],
      };
    });
    expect(expiries).toEqual(everyOrder(3, (periodEnd + RENEWAL_GRACE_SEC) * 1000));
  });

  test.each([
    ["a monthly subscription on a yearly policy", () => yearlyPolicy()],
    ["a subscription sold through a perpetual policy", () => ids.policy],
  ])("%s expires with its paid period whichever of checkout and invoice comes first", async (_, policy) => {
    const price = offering(policy());
    const periodEnd = nowSec() + 30 * DAY;
    const expiries = await expiryByOrder((subscription) => {
      const session = checkout(price, { subscription });
      return {
        session,
        events: [
          event("checkout.session.completed", session),
          event("invoice.paid", invoice(subscription, periodEnd)),
        ],
      };
    });
    expect(expiries).toEqual(everyOrder(2, (periodEnd + RENEWAL_GRACE_SEC) * 1000));
  });

  test("before any paid invoice, a checkout, a cancellation and its undoing leave the checkout's starting expiry in every delivery order", async () => {
    const price = offering(ids.subscriptionPolicy, { licenseDurationDays: 365 });
    const now = t.clock.freeze();
    try {
      const periodEnd = nowSec() + 30 * DAY;
      const expiries = await expiryByOrder((subscription) => {
        const session = checkout(price, { subscription });
        const created = nowSec();
        return {
          session,
          events: [
            event("checkout.session.completed", session),
            changeAt(
              "customer.subscription.updated",
              subscriptionState(subscription, periodEnd, { cancel_at: nowSec() + 10 * DAY }),
              created,
            ),
            changeAt(
              "customer.subscription.updated",
              subscriptionState(subscription, periodEnd),
              created + 10,
            ),
          ],
        };
      });
      expect(expiries).toEqual(everyOrder(3, now.getTime() + 365 * DAY * 1000));
    } finally {
      t.clock.resume();
    }
  });

  test("a change that touches nothing about cancellation leaves the paid period as it is", async () => {
    const price = offering(ids.subscriptionPolicy, { licenseDurationDays: 365 });
    const subscription = next("sub");
    const session = checkout(price, { subscription });
    const periodEnd = nowSec() + 30 * DAY;
    await deliver(event("checkout.session.completed", session));
    await deliver(event("invoice.paid", invoice(subscription, periodEnd)));
    const paid = licensesOfCheckout(session.id)[0];
    const plain = subscriptionState(subscription, periodEnd, { default_payment_method: "pm_1" });
    const response = await deliver(changeAt("customer.subscription.updated", plain, nowSec()));
    expect(response.body.data.result).toBe("ignored");
    const after = licensesOfCheckout(session.id)[0];
    expect(after?.expiresAt?.getTime()).toBe((periodEnd + RENEWAL_GRACE_SEC) * 1000);
    expect(after?.version).toBe(paid?.version);
  });
});
