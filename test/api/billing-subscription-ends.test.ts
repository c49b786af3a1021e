import { beforeAll, describe, expect, test } from "bun:test";
import { and, eq } from "drizzle-orm";
import { announceExpiries } from "../../src/modules/webhooks/expiries.ts";
import { WebhookService } from "../../src/modules/webhooks/service.ts";
import { auditEvents } from "../../src/store/schema/index.ts";
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
 * How a subscription's end reaches its license and the license.expired webhook: once, whatever
 * further updates an ended subscription gets, and whatever the license's suspension.
 */
useBillingContext({ configured: true });

const DAY = 86_400;

beforeAll(() => {
  new WebhookService(t.deps, { allowPrivateNetworks: false }).create(
    { url: "https://receiver.example.com/hook", events: ["license.expired", "license.updated"] },
    { actor: ACTOR, environment: "test", requestId: null },
  );
});

/** A bought subscription paid for a month, its license's expiry scanned once. */
async function paidSubscription() {
  const subscription = next("sub");
  const session = checkout(offering(ids.subscriptionPolicy), { subscription });
  await deliver(event("checkout.session.completed", session));
  const periodEnd = nowSec() + 30 * DAY;
  await deliver(event("invoice.paid", invoice(subscription, periodEnd)));
  announceExpiries(t.deps);
  const license = () => {
    const [row] = licensesOfCheckout(session.id);
    if (!row) throw new Error("the checkout made no license");
    return row;
  };
  return { subscription, periodEnd, license };
}

const announcedExpiries = (licenseId: string) =>
  t.deps.sqlite
    .query<{ n: number }, [string]>(
      "SELECT count(*) AS n FROM webhook_events WHERE type = 'license.expired' AND payload LIKE ?",
    )
    .get(`%${licenseId}%`)?.n;

const auditCount = (licenseId: string, type: string) =>
  t.deps.db
    .select()
    .from(auditEvents)
    .where(and(eq(auditEvents.targetId, licenseId), eq(auditEvents.type, type)))
    .all().length;

describe("an unpaid subscription", () => {
  test("ends its license when Stripe made the event, not when it is delivered", async () => {
    const { subscription, periodEnd, license } = await paidSubscription();
    const made = nowSec();
    const unpaid = changeAt(
      "customer.subscription.updated",
      subscriptionState(subscription, periodEnd, { status: "unpaid" }),
      made,
    );
    t.clock.advance(120);
    expect((await deliver(unpaid)).body.data.result).toBe("succeeded");
    expect(license().expiresAt?.getTime()).toBe(made * 1000);
  });

  test("later updates while it stays unpaid leave the ended license's end where it was, write nothing, and never announce it again", async () => {
    const { subscription, periodEnd, license } = await paidSubscription();
    // Dunning gave up within the renewal's grace day: Stripe marks the subscription unpaid.
    t.clock.advance(30 * DAY + 3600);
    announceExpiries(t.deps);
    const first = nowSec();
    const unpaid = (end: number) => subscriptionState(subscription, end, { status: "unpaid" });
    await deliver(changeAt("customer.subscription.updated", unpaid(periodEnd + 30 * DAY), first));
    expect(license().expiresAt?.getTime()).toBe(first * 1000);
    const updates = auditCount(license().id, "license.updated");
    t.clock.advance(60);
    announceExpiries(t.deps);
    // Stripe keeps rolling the period of the still-unpaid subscription.
    for (let i = 2; i <= 4; i++) {
      t.clock.advance(3600);
      const later = changeAt("customer.subscription.updated", unpaid(periodEnd + i * 30 * DAY), nowSec());
      expect((await deliver(later)).body.data.result).toBe("ignored");
      t.clock.advance(60);
      announceExpiries(t.deps);
    }
    expect(license().expiresAt?.getTime()).toBe(first * 1000);
    expect(auditCount(license().id, "license.updated")).toBe(updates);
    expect(announcedExpiries(license().id)).toBe(1);
  });

  test("canceled after it was unpaid, the license's end moves to the cancellation but is not announced a second time", async () => {
    const { subscription, periodEnd, license } = await paidSubscription();
    t.clock.advance(30 * DAY + 3600);
    const unpaidAt = nowSec();
    await deliver(
      changeAt(
        "customer.subscription.updated",
        subscriptionState(subscription, periodEnd, { status: "unpaid" }),
        unpaidAt,
      ),
    );
    t.clock.advance(60);
    announceExpiries(t.deps);
    t.clock.advance(3600);
    const canceledAt = nowSec() - 60;
    const canceled = changeAt(
      "customer.subscription.deleted",
      subscriptionState(subscription, periodEnd, { status: "canceled", ended_at: canceledAt }),
      nowSec(),
    );
    expect((await deliver(canceled)).body.data.result).toBe("succeeded");
    expect(license().expiresAt?.getTime()).toBe(canceledAt * 1000);
    t.clock.advance(60);
    announceExpiries(t.deps);
    expect(announcedExpiries(license().id)).toBe(1);
  });
});

describe("a suspended license", () => {
  test("ended by a subscription deletion delivered late is announced as expired once, and stays expired when reinstated", async () => {
    const { subscription, license } = await paidSubscription();
    const suspended = await t.call("PATCH", `/mgmt/v1/licenses/${license().id}`, {
      key: t.keys.test,
      body: { status_action: "suspended", reason: "chargeback review" },
    });
    expect(suspended.status).toBe(200);
    // Stripe ended it an hour ago; the scan has passed that moment by the time the event arrives.
    const endedAt = nowSec() - 3600;
    t.clock.advance(30);
    announceExpiries(t.deps);
    const deleted = event("customer.subscription.deleted", {
      id: subscription,
      object: "subscription",
      status: "canceled",
      ended_at: endedAt,
    });
    expect((await deliver(deleted)).body.data.result).toBe("succeeded");
    expect(license().expiresAt?.getTime()).toBe(endedAt * 1000);
    expect(license().expiryAnnounced?.getTime()).toBe(endedAt * 1000);
    expect(auditCount(license().id, "license.expired")).toBe(1);
    t.clock.advance(30);
    announceExpiries(t.deps);
    const reinstated = await t.call("PATCH", `/mgmt/v1/licenses/${license().id}`, {
      key: t.keys.test,
      body: { status_action: "active" },
    });
    expect(reinstated.body.error.code).toBe("INVALID_TRANSITION");
    t.clock.advance(30);
    announceExpiries(t.deps);
    expect(announcedExpiries(license().id)).toBe(1);
  });
});
