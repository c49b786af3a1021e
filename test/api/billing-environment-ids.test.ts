import { beforeAll, describe, expect, test } from "bun:test";
import { and, eq } from "drizzle-orm";
import { billingEvents } from "../../src/store/schema/index.ts";
import {
  ACTOR,
  billing,
  checkout,
  deliver,
  event,
  LIVE_API_KEY,
  LIVE_SECRET,
  licensesOfCheckout,
  next,
  offering,
  t,
  useBillingContext,
} from "../support/billing.ts";
import { factories } from "../support/factories.ts";

/**
 * Event ids and checkout ids are the environment's own. Each mode has its own signing secret, and
 * provider ids are no secret to the vendor's staff: whoever holds only the test secret must not be
 * able to send a test event (or checkout) with a live one's id first, and so make the live
 * delivery answer "replayed" or "already fulfilled" and create nothing.
 */
useBillingContext({ configured: true });

let livePrice: string;
beforeAll(() => {
  billing.configure(
    { provider: "stripe", apiKey: LIVE_API_KEY, webhookSecret: LIVE_SECRET, secureClaims: true },
    ACTOR,
  );
  const f = factories(t);
  const product = f.product({ environment: "live", name: "Live widget" });
  const policy = f.policy({ productId: product.id, environment: "live" });
  livePrice = `price_live${Date.now()}`;
  billing.addOffering({ priceId: livePrice, productId: product.id, policyId: policy.id }, ACTOR);
});

const liveCheckout = () => ({ ...checkout(livePrice), id: next("cs_live") });
const eventRow = (environment: "live" | "test", eventId: string) =>
  t.deps.db
    .select()
    .from(billingEvents)
    .where(and(eq(billingEvents.environment, environment), eq(billingEvents.eventId, eventId)))
    .get();

describe("ids per environment", () => {
  test("a test event sent first with a live event's id does not stop the live delivery", async () => {
    const id = next("evt");
    const shadow = { ...event("charge.refunded", { id: next("ch"), object: "charge" }), id };
    expect((await deliver(shadow)).body.data).toEqual({ event_id: id, result: "ignored", replayed: false });
    const session = liveCheckout();
    const live = { ...event("checkout.session.completed", session, true), id };
    const answer = await deliver(live, { secret: LIVE_SECRET });
    expect(answer.body.data).toEqual({ event_id: id, result: "succeeded", replayed: false });
    expect(licensesOfCheckout(session.id)).toHaveLength(1);
    expect([eventRow("test", id)?.type, eventRow("live", id)?.type]).toEqual([
      "charge.refunded",
      "checkout.session.completed",
    ]);
    // Each is still its environment's replay.
    expect((await deliver(live, { secret: LIVE_SECRET })).body.data.replayed).toBe(true);
    expect((await deliver(shadow)).body.data.replayed).toBe(true);
  });

  test("a test event with a failed live event's id leaves the live one to be applied when resent", async () => {
    const price = `price_later${Date.now()}`;
    const session = { ...checkout(price), id: next("cs_live") };
    const live = event("checkout.session.completed", session, true);
    expect((await deliver(live, { secret: LIVE_SECRET })).body.data.result).toBe("failed");
    const shadow = { ...event("ping", { id: "x" }), id: live.id };
    expect((await deliver(shadow)).body.data.result).toBe("ignored");
    expect(eventRow("live", live.id)?.result).toBe("failed");
    const product = factories(t).product({ environment: "live" });
    const policy = factories(t).policy({ productId: product.id, environment: "live" });
    billing.addOffering({ priceId: price, productId: product.id, policyId: policy.id }, ACTOR);
    expect((await deliver(live, { secret: LIVE_SECRET })).body.data.result).toBe("succeeded");
    expect(licensesOfCheckout(session.id)).toHaveLength(1);
  });

  test("a test checkout with a live checkout's id makes its own test license, not a pointer to the live one", async () => {
    const session = liveCheckout();
    await deliver(event("checkout.session.completed", session, true), { secret: LIVE_SECRET });
    const [liveLicense] = licensesOfCheckout(session.id);
    const testEvent = event("checkout.session.completed", { ...checkout(offering()), id: session.id });
    expect((await deliver(testEvent)).body.data.result).toBe("succeeded");
    const both = licensesOfCheckout(session.id);
    expect(both.map((license) => license.environment).sort()).toEqual(["live", "test"]);
    expect(eventRow("test", testEvent.id)?.licenseId).not.toBe(liveLicense?.id);
  });

  test("the same checkout in one environment is still fulfilled once", async () => {
    const session = liveCheckout();
    await deliver(event("checkout.session.completed", session, true), { secret: LIVE_SECRET });
    const second = await deliver(event("checkout.session.async_payment_succeeded", session, true), {
      secret: LIVE_SECRET,
    });
    expect(second.body.data.result).toBe("ignored");
    expect(licensesOfCheckout(session.id)).toHaveLength(1);
  });
});
