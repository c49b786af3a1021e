import { afterEach, beforeEach, expect, test } from "bun:test";
import { createApp } from "../../src/app.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";

/**
 * /readyz as a load balancer reads it. The server listens only once the store is migrated and the
 * keystore unlocked, so an app that is not ready is one shutting down, and says so.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const readyz = (ready: boolean) =>
  createApp(t.deps, { baseUrl: BASE_URL, readiness: { ready: () => ready } }).handle(
    new Request(`${BASE_URL}/readyz`),
  );

test("a serving app answers /readyz with 200", async () => {
  const response = await readyz(true);
  expect(response.status).toBe(200);
  expect(await response.json()).toEqual({ status: "ready" });
});

test("an app shutting down answers /readyz with 503 that says it is shutting down, not starting", async () => {
  const response = await readyz(false);
  expect(response.status).toBe(503);
  const body = (await response.json()) as { error: { code: string; message: string } };
  expect(body.error).toMatchObject({ code: "SERVICE_UNAVAILABLE", message: "The service is shutting down." });
});
