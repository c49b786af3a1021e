import { describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { BillingService } from "../../src/modules/billing/service.ts";
import {
  ACTOR,
  billing,
  checkout,
  configureTest,
  deliver,
  event,
  header,
  ids,
  LIVE_API_KEY,
  LIVE_SECRET,
  licensesOfCheckout,
  next,
  nowSec,
  offering,
  TEST_API_KEY,
  TEST_SECRET,
  t,
  useBillingContext,
  WEBHOOK,
} from "../support/billing.ts";
import { factories } from "../support/factories.ts";
import { BASE_URL, createTestContext, serveTestStore } from "../support/harness.ts";
import { storeDigest } from "../support/store-digest.ts";

/**
 * The billing integration itself, against signatures made by Stripe's own library: its status
 * before and after set-up, the webhook's signature checks, the plan's entitlement, the test and
 * live modes kept apart, and a delivery to a running server over real HTTP.
 */
useBillingContext();

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
      last_failure: null,
      unresolved_failures: 0,
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

  test("an offering's name follows the API's name rule in the service itself, and a refused one stores nothing", () => {
    configureTest();
    for (const name of ["", "two\nlines", "x".repeat(201), "bell\u0007"]) {
      const before = storeDigest(t.deps.sqlite);
      let thrown: unknown;
      try {
        billing.addOffering(
          { priceId: `price_named${Date.now()}`, productId: ids.product, policyId: ids.policy, name },
          ACTOR,
        );
      } catch (error) {
        thrown = error;
      }
      expect(thrown).toMatchObject({
        code: "VALIDATION_FAILED",
        details: { errors: { name: [expect.stringContaining("1 to 200 characters")] } },
      });
      expect(storeDigest(t.deps.sqlite)).toBe(before);
    }
    const named = billing.addOffering(
      {
        priceId: `price_named${Date.now()}`,
        productId: ids.product,
        policyId: ids.policy,
        name: "Pro, yearly",
      },
      ACTOR,
    );
    expect(named.name).toBe("Pro, yearly");
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
    ["signed 301 seconds in the future", async () => ({ timestamp: nowSec() + 301 }), "expired"],
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
      // Held still while signing and checking, so 301 s ahead cannot read as 300 when a second
      // ticks over in between; the file's later tests get a running clock back.
      t.clock.freeze();
      const response = await deliver(e, await make(e)).finally(() => t.clock.resume());
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
