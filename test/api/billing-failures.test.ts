import { describe, expect, test } from "bun:test";
import type { Logger, LogLevel } from "../../src/http/logger.ts";
import {
  ACTOR,
  billing,
  changeAt,
  checkout,
  configureTest,
  deliver,
  event,
  ids,
  invoice,
  licensesOfCheckout,
  next,
  nowSec,
  offering,
  subscriptionState,
  TEST_API_KEY,
  TEST_SECRET,
  t,
  useBillingContext,
} from "../support/billing.ts";
import { factories } from "../support/factories.ts";

/**
 * A paid purchase that fails on our side is answered 200, so the provider stops retrying: it must
 * stay visible until the vendor fixes the cause and resends the event. It leaves a
 * `billing_event.failed` audit event, a warning in the log and the integration's `last_failure`,
 * which later deliveries do not overwrite; a resend that is applied shows it resolved.
 */
const lines: { level: LogLevel; msg: string; fields: Record<string, unknown> }[] = [];
const logger: Logger = { log: (level, msg, fields = {}) => lines.push({ level, msg, fields }) };
useBillingContext({ configured: true, logger });

const status = async (key = t.keys.test) =>
  (await t.call("GET", "/mgmt/v1/billing-integration", { key })).body.data;

const failedEvents = async (key = t.keys.test) =>
  (await t.call("GET", "/mgmt/v1/events", { key })).body.data.filter(
    (row: { type: string }) => row.type === "billing_event.failed",
  );

const warnings = () => lines.filter((line) => line.msg === "billing event failed");

describe("a failed billing event", () => {
  test("is audited, logged without the buyer's address, and kept as last_failure when later events succeed", async () => {
    const price = `price_unmapped${Date.now()}`;
    const email = `${next("buyer")}@example.com`;
    const subscription = next("sub");
    const session = checkout(price, { subscription, email });
    const failed = event("checkout.session.completed", session);
    const answer = await deliver(failed);
    expect([answer.status, answer.body.data.result]).toEqual([200, "failed"]);

    // Seconds later the subscription's invoice comes, and succeeds: last_event moves on.
    const paid = event("invoice.paid", invoice(subscription, nowSec() + 30 * 86_400));
    expect((await deliver(paid)).body.data.result).toBe("succeeded");
    const after = await status();
    expect(after.last_event).toMatchObject({ id: paid.id, result: "succeeded" });
    expect(after.last_failure).toMatchObject({
      id: failed.id,
      type: "checkout.session.completed",
      result: "failed",
      reason: "unknown_price",
      resolved_at: null,
    });
    expect(after.unresolved_failures).toBe(1);

    const [audited, ...others] = await failedEvents();
    expect(others).toEqual([]);
    expect(audited).toMatchObject({
      actor: { type: "billing", id: "stripe" },
      target: { type: "billing_event", id: failed.id, environment: "test" },
      data: {
        event_id: failed.id,
        event_type: "checkout.session.completed",
        reason: "unknown_price",
        attempts: 1,
        checkout_id: session.id,
        subscription_id: subscription,
        price_ids: [price],
      },
    });
    const [warning, ...moreWarnings] = warnings();
    expect(moreWarnings).toEqual([]);
    expect(warning).toMatchObject({
      level: "warn",
      fields: { environment: "test", event_id: failed.id, reason: "unknown_price", checkout_id: session.id },
    });
    // Personal data of buyers stays out of the audit log and the server log.
    expect(JSON.stringify([audited, warning])).not.toContain(email);
    expect(JSON.stringify([audited, warning])).not.toContain("Ada Buyer");

    // Fixed and resent: applied, and the failure shows as resolved rather than disappearing.
    billing.addOffering({ priceId: price, productId: ids.product, policyId: ids.subscriptionPolicy }, ACTOR);
    expect((await deliver(failed)).body.data.result).toBe("succeeded");
    expect(licensesOfCheckout(session.id)).toHaveLength(1);
    const resolved = await status();
    expect(resolved.last_failure).toMatchObject({ id: failed.id, reason: "unknown_price" });
    expect(resolved.last_failure.resolved_at).toEqual(expect.any(String));
    expect(resolved.unresolved_failures).toBe(0);
    expect(await failedEvents()).toHaveLength(1);
  });

  test("refused by a rule of ours (an archived product) is audited with the error code as its reason", async () => {
    const f = factories(t);
    const product = f.product({ environment: "test" });
    const policy = f.policy({ productId: product.id, environment: "test" });
    const price = `price_archived${Date.now()}`;
    billing.addOffering({ priceId: price, productId: product.id, policyId: policy.id }, ACTOR);
    await t.call("DELETE", `/mgmt/v1/products/${product.id}`, { key: t.keys.test });
    const failed = event("checkout.session.completed", checkout(price));
    expect((await deliver(failed)).body.data.result).toBe("failed");
    // Resent unchanged, it fails again: a second audit event, with the attempts counted.
    expect((await deliver(failed)).body.data.result).toBe("failed");
    const mine = (await failedEvents()).filter(
      (row: { data: { event_id: string } }) => row.data.event_id === failed.id,
    );
    expect(mine.map((row: { data: { reason: string; attempts: number } }) => row.data)).toMatchObject([
      { reason: "PRODUCT_ARCHIVED", attempts: 2 },
      { reason: "PRODUCT_ARCHIVED", attempts: 1 },
    ]);
    expect((await status()).last_failure).toMatchObject({
      id: failed.id,
      reason: "PRODUCT_ARCHIVED",
      resolved_at: null,
    });
  });

  test("that the provider retries (its API unreachable) is kept as last_failure and logged, but not audited", async () => {
    const closed = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("") });
    const port = closed.port;
    closed.stop(true);
    const auditedBefore = (await failedEvents()).length;
    const warnedBefore = warnings().length;
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
    const failed = event("checkout.session.completed", { ...checkout("price_x"), metadata: {} });
    try {
      expect((await deliver(failed)).status).toBe(503);
    } finally {
      configureTest();
    }
    expect((await status()).last_failure).toMatchObject({
      id: failed.id,
      reason: "provider_unreachable",
      resolved_at: null,
    });
    expect(await failedEvents()).toHaveLength(auditedBefore);
    expect(warnings().slice(warnedBefore)).toMatchObject([
      { level: "warn", fields: { event_id: failed.id, retried_by_provider: true } },
    ]);
  });

  test("that no resend can fix is kept as last_failure and audited, but not counted as unresolved", async () => {
    const price = offering(ids.subscriptionPolicy);
    const before = (await status()).unresolved_failures;
    // The subscription ended before its checkout came (Stripe does not order its events).
    const subscription = next("sub");
    const ended = changeAt(
      "customer.subscription.deleted",
      subscriptionState(subscription, nowSec() + 30 * 86_400, {
        status: "canceled",
        ended_at: nowSec() - 10,
      }),
      nowSec() - 5,
    );
    expect((await deliver(ended)).body.data.result).toBe("succeeded");
    const lateCheckout = event("checkout.session.completed", checkout(price, { subscription }));
    const { created: _, ...noCreated } = event(
      "customer.subscription.updated",
      subscriptionState(next("sub"), nowSec()),
    );
    const noPeriod = event("invoice.paid", {
      ...invoice(next("sub"), nowSec()),
      lines: { object: "list", data: [] },
    });
    const terminal = [
      [lateCheckout, "subscription_ended"],
      [noCreated, "malformed_event"],
      [noPeriod, "no_period_end"],
    ] as const;
    for (const [sent, reason] of terminal) {
      expect((await deliver(sent)).body.data.result).toBe("failed");
      expect((await status()).last_failure).toMatchObject({ id: sent.id, reason, resolved_at: null });
      expect((await status()).unresolved_failures).toBe(before);
      const audited = (await failedEvents()).filter(
        (row: { data: { event_id: string } }) => row.data.event_id === sent.id,
      );
      expect(audited).toHaveLength(1);
    }
    // Resent, it fails the same way, and still counts for nothing.
    expect((await deliver(lateCheckout)).body.data.result).toBe("failed");
    expect((await status()).unresolved_failures).toBe(before);

    // A failure the vendor can fix still counts beside them.
    const fixable = event("checkout.session.completed", checkout(`price_unmapped${Date.now()}`));
    expect((await deliver(fixable)).body.data.result).toBe("failed");
    expect((await status()).unresolved_failures).toBe(before + 1);
  });

  test("of one environment shows in that environment's status only", async () => {
    expect((await status(t.keys.live)).last_failure).toBeNull();
    expect((await status(t.keys.live)).unresolved_failures).toBe(0);
    expect(await failedEvents(t.keys.live)).toEqual([]);
  });
});
