import { afterEach, beforeEach, expect, test } from "bun:test";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";

/**
 * What the license routes ask SQLite, and how it answers: at a million live licenses a query that
 * reads every license holds the one JS thread for about a second, with every heartbeat waiting.
 * The plans are SQLite's own for these statements, as production runs them (no ANALYZE).
 */
let t: TestContext;
let ids: { product: string; policy: string; customer: string };

beforeEach(() => {
  t = createTestContext();
  const f = factories(t);
  const product = f.product({ environment: "live" });
  const policy = f.policy({ productId: product.id, environment: "live" });
  const customer = f.customer();
  ids = { product: product.id, policy: policy.id, customer: customer.id };
});
afterEach(() => t.close());

const createLicense = () =>
  t.call("POST", "/mgmt/v1/licenses", {
    body: { product_id: ids.product, policy_id: ids.policy, customer_id: ids.customer },
    headers: t.idem(),
  });

test("a license create reads the plan's quota from the tally and never counts the licenses", async () => {
  const { result, sql } = await sqlPreparedDuring(t.deps.sqlite, createLicense);
  expect(result.status).toBe(201);
  expect(sql.some((text) => /from "license_tallies"/i.test(text))).toBe(true);
  expect(sql.filter((text) => /count\(\*\)[\s\S]*from "licenses"/i.test(text))).toEqual([]);
});

test("GET /mgmt/v1/plan reads the tally and never counts the licenses", async () => {
  const { result, sql } = await sqlPreparedDuring(t.deps.sqlite, () => t.call("GET", "/mgmt/v1/plan"));
  expect(result.status).toBe(200);
  expect(sql.filter((text) => /count\(\*\)[\s\S]*from "licenses"/i.test(text))).toEqual([]);
});

test("filtering the list by product or by customer walks an index in the list's order, with no sort", async () => {
  await createLicense();
  for (const [filter, index] of [
    [`product_id=${ids.product}`, "licenses_env_product"],
    [`customer_id=${ids.customer}`, "licenses_env_customer"],
  ] as const) {
    const { result, sql } = await sqlPreparedDuring(t.deps.sqlite, () =>
      t.call("GET", `/mgmt/v1/licenses?${filter}&limit=10`),
    );
    expect(result.body.data).toHaveLength(1);
    const listed = sql.find((text) => /from "licenses" where/i.test(text) && /order by/i.test(text));
    expect(listed).toBeDefined();
    const plan = queryPlan(t.deps.sqlite, listed as string);
    expect(plan).toStartWith(`SEARCH licenses USING INDEX ${index} (`);
    expect(plan).not.toContain("TEMP B-TREE");
  }
});
