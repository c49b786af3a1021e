import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * The served pages' JSON calls (the passkey pages', the billing claim page's redeem) take no
 * credential but the secret in the link, and each costs keystore HMACs and a store transaction:
 * they share the per-address window of the unauthenticated runtime calls (docs/api.md, Rate
 * limits), like email-verification confirm.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext({ runtimeRateLimits: { ip: { limit: 3, windowSec: 60 } } });
});
afterEach(() => t.close());

const CALLS = [
  ["/passkeys/v1/register/options", { token: "A".repeat(43) }],
  ["/passkeys/v1/register", { token: "A".repeat(43) }],
  ["/passkeys/v1/approve/options", { verification_id: "ver_unknown", secret: "A".repeat(43) }],
  ["/passkeys/v1/approve", { verification_id: "ver_unknown", secret: "A".repeat(43) }],
  ["/billing/v1/claims/redeem", { token: "A".repeat(43) }],
] as const;

const runtimeUsed = async () =>
  (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas.runtime_requests.used as number;

describe("the served pages' calls", () => {
  test.each(CALLS)("POST %s is refused with 429 once the address's window is used up", async (path, body) => {
    const from = (clientAddress: string) => t.call("POST", path, { key: null, body, clientAddress });
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push(await from("203.0.113.7"));
    expect(answers.slice(0, 3).map((a) => a.status)).not.toContain(429);
    expect(answers[0]?.headers.get("ratelimit-policy")).toBe('"runtime-ip";q=3;w=60');
    const refused = answers[3];
    expect([refused?.status, refused?.body.error.code]).toEqual([429, "RATE_LIMITED"]);
    expect(refused?.headers.get("retry-after")).not.toBeNull();
    expect(refused?.body.error.details.policy).toBe("runtime-ip");
    // The page's user sees this text: it names no API they have never heard of.
    expect(refused?.body.error.message).toBe("Too many requests from this address; try again shortly.");
    // Another address has its own window.
    expect((await from("203.0.113.8")).status).not.toBe(429);
  });

  test.each(CALLS)(
    "POST %s/ (a trailing slash, which the router serves as the same route) is limited alike",
    async (path, body) => {
      const answers = [];
      for (let i = 0; i < 4; i++)
        answers.push(await t.call("POST", `${path}/`, { key: null, body, clientAddress: "203.0.113.20" }));
      expect(answers.map((a) => a.status)).toEqual([...answers.slice(0, 3).map((a) => a.status), 429]);
      expect(answers[0]?.status).not.toBe(429);
    },
  );

  test("share the window with the runtime calls from the same address", async () => {
    const [path, body] = CALLS[2];
    for (let i = 0; i < 3; i++)
      await t.call("POST", path, { key: null, body, clientAddress: "198.51.100.1" });
    const time = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: "prod_unknown", nonce: "a-time-nonce-of-enough-length" },
      clientAddress: "198.51.100.1",
    });
    expect(time.status).toBe(429);
  });

  test("never count toward the monthly Runtime allowance and are not refused by an ended plan", async () => {
    const before = await runtimeUsed();
    for (const [path, body] of CALLS) await t.call("POST", path, { key: null, body });
    expect(await runtimeUsed()).toBe(before);
    t.workspace.setPlan("business", undefined, { endsAt: new Date(t.clock.now().getTime() - 1000) });
    const answer = await t.call("POST", CALLS[0][0], {
      key: null,
      body: CALLS[0][1],
      clientAddress: "192.0.2.1",
    });
    expect([answer.status, answer.body.error.code]).toEqual([404, "NOT_FOUND"]);
  });

  test.each(["/passkeys/v1/approve", "/billing/v1/claims"])(
    "the page %s itself (GET) is not limited",
    async (path) => {
      for (let i = 0; i < 6; i++) {
        const page = await t.call("GET", path, { key: null, clientAddress: "203.0.113.9" });
        expect(page.status).toBe(200);
      }
    },
  );
});
