import { afterAll, beforeAll, expect, test } from "bun:test";
import { BillingService } from "../../src/modules/billing/service.ts";
import { SEALED } from "../../src/store/data-key.ts";
import { TEST_API_KEY, TEST_SECRET } from "../support/billing.ts";
import { TestDevice } from "../support/device.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { enableTotp, namedUserFixture, startVerification } from "../support/named-users.ts";

/**
 * Start-up and restore try the keystore's data key on values the services sealed (data-key.ts).
 * A wrong table, column or context there would make a store whose only sealed values are of that
 * kind refuse to start with its own keystore, so each kind is made here the way the service makes
 * it, and must decrypt the way data-key.ts reads it.
 */
let t: TestContext;
beforeAll(async () => {
  t = createTestContext();
  const fixture = await namedUserFixture(t);
  await enableTotp(t, fixture.userId);
  expect((await startVerification(t, new TestDevice(), fixture, fixture.email)).status).toBe(202);
  const webhook = await t.call("POST", "/mgmt/v1/webhooks", {
    body: { name: "Hook", url: "https://hooks.example.com/licensing", events: ["license.created"] },
    headers: t.idem(),
  });
  expect(webhook.status).toBe(201);
  new BillingService(t.deps, () => t.workspace.plan(), BASE_URL).configure(
    {
      provider: "stripe",
      apiKey: TEST_API_KEY,
      webhookSecret: TEST_SECRET,
      secureClaims: true,
    },
    { type: "cli", id: "test" },
  );
});
afterAll(() => t.close());

test("every kind of value the data key is tried on is found, and decrypts as data-key.ts reads it", () => {
  const opened = SEALED.map(({ table, column, contextColumn, context }) => {
    const row = t.deps.sqlite
      .query<{ key: string; sealed: string }, []>(
        `SELECT "${contextColumn}" AS key, "${column}" AS sealed FROM "${table}" WHERE "${column}" IS NOT NULL LIMIT 1`,
      )
      .get();
    if (!row) return `${table}: no value`;
    try {
      t.deps.secrets.decrypt(row.sealed, context(row.key));
      return `${table}: decrypts`;
    } catch (error) {
      return `${table}: ${(error as Error).message}`;
    }
  });
  expect(opened).toEqual(SEALED.map(({ table }) => `${table}: decrypts`));
});
