import { afterEach, beforeEach, expect, test } from "bun:test";
import { silentLogger } from "../../src/http/logger.ts";
import { sweepOnce } from "../../src/jobs/sweeper.ts";
import { createServices } from "../../src/services.ts";
import { factories } from "../support/factories.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const count = (table: string) =>
  (t.deps.sqlite.query(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n;

test("a sweep drops idempotency records older than 24 hours and keeps younger ones", async () => {
  await t.call("POST", "/mgmt/v1/products", {
    body: { name: "A", code: "a", environment: "live" },
    headers: t.idem(),
  });
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  sweepOnce(services, silentLogger);
  expect(count("idempotency_records")).toBe(1);
  t.clock.advance(24 * 3600 + 1);
  sweepOnce(services, silentLogger);
  expect(count("idempotency_records")).toBe(0);
});

test("a sweep drops runtime events last seen more than 7 days ago", () => {
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const { product } = factories(t).catalog();
  services.runtimeEvents.record({
    environment: "live",
    operation: "heartbeat",
    code: "CLOCK_SKEW",
    httpStatus: 401,
    productId: product.id,
    requestId: "req_x",
  });
  t.clock.advance(6 * 86_400);
  sweepOnce(services, silentLogger);
  expect(count("runtime_events")).toBe(1);
  t.clock.advance(86_400 + 1);
  sweepOnce(services, silentLogger);
  expect(count("runtime_events")).toBe(0);
});

test("a sweep gives a product left pending its signing key and bundle", async () => {
  const pending = factories(t).product({ signingStatus: "pending" });
  const before = await t.call("GET", `/runtime/v1/products/${pending.id}/trust-bundle`, { key: null });
  expect(before.status).toBe(409);
  expect(before.body.error.code).toBe("SIGNING_KEY_PENDING");
  sweepOnce(createServices(t.deps, { baseUrl: BASE_URL }), silentLogger);
  const after = await t.call("GET", `/runtime/v1/products/${pending.id}/trust-bundle`, { key: null });
  expect(after.status).toBe(200);
  expect(after.body.data.bundle.signing_keys).toHaveLength(1);
  expect((await t.call("GET", `/mgmt/v1/products/${pending.id}`)).body.data.signing_status).toBe("ready");
});
