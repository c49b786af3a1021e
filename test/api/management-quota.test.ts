import { afterEach, beforeEach, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
  t.workspace.setPlan("free");
});
afterEach(() => t.close());

const month = () => t.clock.now().toISOString().slice(0, 7);
/** This month's counter as the meter would have flushed it. */
const seed = (count: number) =>
  t.deps.sqlite.run(
    "INSERT INTO usage_counters (metric, period, count) VALUES ('management_requests', ?, ?)",
    [month(), count],
  );

test("management requests count toward the monthly allowance, shown by the plan report", async () => {
  await t.call("GET", "/mgmt/v1/products");
  await t.call("GET", "/mgmt/v1/customers");
  const quota = (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas.management_requests;
  expect(quota).toMatchObject({ limit: 10_000, used: 2, remaining: 9_998, limit_with_overage: 11_000 });
  const now = t.clock.now();
  expect(quota.resets_at).toBe(
    new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1)).toISOString(),
  );
});

test("past the allowance with overage, management calls answer 429 until the month turns; /plan still answers", async () => {
  seed(10_999);
  expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
  const refused = await t.call("GET", "/mgmt/v1/products");
  expect(refused.status).toBe(429);
  expect(refused.body.error).toMatchObject({
    code: "RATE_LIMITED",
    details: { quota: "management_requests", limit: 10_000, limit_with_overage: 11_000 },
  });
  expect(Number(refused.headers.get("retry-after"))).toBeGreaterThan(0);
  const plan = await t.call("GET", "/mgmt/v1/plan");
  expect(plan.status).toBe(200);
  expect(plan.body.data.quotas.management_requests).toMatchObject({ used: 11_000, remaining: 0 });
  const days = Math.ceil(Number(refused.headers.get("retry-after")) / 86_400);
  t.clock.advance(days * 86_400);
  expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
});

test("the plan report counts toward no allowance however the router serves it: HEAD, or with a trailing slash", async () => {
  // One call left this month: the plan report's other forms use none of it, and answer anyway.
  seed(10_999);
  for (const [method, path] of [
    ["GET", "/mgmt/v1/plan/"],
    ["HEAD", "/mgmt/v1/plan"],
    ["HEAD", "/mgmt/v1/plan/"],
    ["GET", "/mgmt/v1/plan/"],
  ] as const) {
    expect((await t.call(method, path)).status).toBe(200);
  }
  expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
  expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(429);
  expect((await t.call("GET", "/mgmt/v1/plan/")).body.data.quotas.management_requests.used).toBe(11_000);
});

test("refused and unauthenticated requests are not counted", async () => {
  await t.call("GET", "/mgmt/v1/products", { key: null });
  await t.call("GET", "/mgmt/v1/products", { key: `lsk_live_${"x".repeat(32)}` });
  expect((await t.call("GET", "/mgmt/v1/plan")).body.data.quotas.management_requests.used).toBe(0);
});
