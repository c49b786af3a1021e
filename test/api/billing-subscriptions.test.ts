import { describe, expect, test } from "bun:test";
import { eq } from "drizzle-orm";
import { RENEWAL_GRACE_SEC } from "../../src/modules/billing/subscriptions.ts";
import { announceExpiries } from "../../src/modules/webhooks/expiries.ts";
import { WebhookService } from "../../src/modules/webhooks/service.ts";
import { auditEvents, billingEvents } from "../../src/store/schema/index.ts";
import {
  ACTOR,
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

/**
 * What subscription events do to the license a checkout made, delivered as Stripe signs them: paid
 * invoices renew it, a cancellation or deletion ends it, and changes are applied in the order
 * Stripe made them, not the order they arrive in.
 */
useBillingContext({ configured: true });

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

  test("a deletion that ends the license at once is announced by its audit event, not again by the expiry scan", async () => {
    new WebhookService(t.deps, { allowPrivateNetworks: false }).create(
      { url: "https://receiver.example.com/hook", events: ["license.expired"] },
      { actor: ACTOR, environment: "test", requestId: null },
    );
    const subscription = next("sub");
    const session = checkout(offering(ids.subscriptionPolicy), { subscription });
    await deliver(event("checkout.session.completed", session));
    await deliver(event("invoice.paid", invoice(subscription, nowSec() + 40 * 86_400)));
    announceExpiries(t.deps);
    t.clock.advance(10);
    const ended = { id: subscription, object: "subscription", status: "canceled", ended_at: nowSec() };
    expect((await deliver(event("customer.subscription.deleted", ended))).body.data.result).toBe("succeeded");
    t.clock.advance(30);
    announceExpiries(t.deps);
    const licenseId = licensesOfCheckout(session.id)[0]?.id as string;
    const announced = t.deps.sqlite
      .query<{ n: number }, [string]>(
        "SELECT count(*) AS n FROM webhook_events WHERE type = 'license.expired' AND payload LIKE ?",
      )
      .get(`%${licenseId}%`);
    expect(announced?.n).toBe(1);
  });
});

describe("subscription events out of order", () => {
  const expiryOf = (sessionId: string) => licensesOfCheckout(sessionId)[0]?.expiresAt?.getTime();
  const state = subscriptionState;

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

describe("times outside any date", () => {
  // One past JavaScript's last date (8.64e15 ms), and the last one itself: neither is a time a
  // subscription can end at.
  const BEYOND_DATES = 8_640_000_000_001;
  const LAST_DATE = 8_640_000_000_000;
  const recordedReason = (eventId: string) =>
    t.deps.db.select().from(billingEvents).where(eq(billingEvents.eventId, eventId)).get()?.reason;
  const expiryOf = (sessionId: string) => licensesOfCheckout(sessionId)[0]?.expiresAt?.getTime();

  test("an invoice whose period ends past every date fails as having no period end and leaves the expiry as it was", async () => {
    const subscription = next("sub");
    const session = checkout(offering(ids.subscriptionPolicy), { subscription });
    await deliver(event("checkout.session.completed", session));
    const before = expiryOf(session.id);
    expect(before).toBeNumber();
    const paid = event("invoice.paid", invoice(subscription, BEYOND_DATES));
    expect((await deliver(paid)).body.data.result).toBe("failed");
    expect(recordedReason(paid.id)).toBe("no_period_end");
    expect(expiryOf(session.id)).toBe(before);
  });

  test("a checkout after an invoice whose period ends at the last date still makes its license", async () => {
    const subscription = next("sub");
    expect((await deliver(event("invoice.paid", invoice(subscription, LAST_DATE)))).body.data.result).toBe(
      "failed",
    );
    const session = checkout(offering(ids.subscriptionPolicy), { subscription });
    const made = await deliver(event("checkout.session.completed", session));
    expect([made.status, made.body.data.result]).toEqual([200, "succeeded"]);
    expect(licensesOfCheckout(session.id)).toHaveLength(1);
  });

  test("a cancellation dated past every date is no cancellation: the license keeps its expiry", async () => {
    const subscription = next("sub");
    const session = checkout(offering(ids.subscriptionPolicy), { subscription });
    await deliver(event("checkout.session.completed", session));
    const periodEnd = nowSec() + 40 * 86_400;
    await deliver(event("invoice.paid", invoice(subscription, periodEnd)));
    const cancelled = {
      id: subscription,
      object: "subscription",
      status: "active",
      cancel_at: BEYOND_DATES,
      items: { object: "list", data: [{ id: "si_1", current_period_end: periodEnd }] },
    };
    expect((await deliver(event("customer.subscription.updated", cancelled))).status).toBe(200);
    expect(expiryOf(session.id)).toBe((periodEnd + RENEWAL_GRACE_SEC) * 1000);
  });
});
