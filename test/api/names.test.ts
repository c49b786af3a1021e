import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * Names are one line of text without control characters: the command line prints them and
 * dashboards show them, where an ESC sequence or a line break could forge what an operator sees.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const count = (table: string) =>
  (t.deps.sqlite.query(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n;

const creates = [
  ["products", "/mgmt/v1/products", (name: string) => ({ name, code: "app", environment: "live" })],
  ["customers", "/mgmt/v1/customers", (name: string) => ({ name })],
  ["resellers", "/mgmt/v1/resellers", (name: string) => ({ name })],
  [
    "webhook_endpoints",
    "/mgmt/v1/webhooks",
    (name: string) => ({ name, url: "https://hooks.example.com/in" }),
  ],
] as const;

describe.each(creates)("a %s name", (table, path, body) => {
  test.each([
    ["an ESC sequence", "Acme\u001b[2J"],
    ["a line break", "Acme\nPaid in full"],
    ["a tab", "Acme\tCorp"],
    ["DEL", "Acme\u007f"],
    ["a C1 control (NEL)", "Acme\u0085Corp"],
    ["a Unicode line separator", "Acme\u2028Paid in full"],
    ["a Unicode paragraph separator", "Acme\u2029Paid in full"],
  ])("with %s answers 422 keyed by name and creates nothing", async (_, name) => {
    const before = count(table);
    const response = await t.call("POST", path, { body: body(name), headers: t.idem() });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors).toEqual({
      name: [expect.stringMatching(/^must be one line of 1 to 200 characters without control characters/)],
    });
    expect(count(table)).toBe(before);
  });

  test("of letters from any script, punctuation and emoji is kept as sent", async () => {
    const name = "Bücher GmbH — 東京 😀 (EU)";
    const response = await t.call("POST", path, { body: body(name), headers: t.idem() });
    expect(response.status).toBe(201);
    expect(response.body.data.name).toBe(name);
  });
});

test("a rename to a name with a control character answers 422 and keeps the old name", async () => {
  const created = await t.call("POST", "/mgmt/v1/customers", { body: { name: "Acme" }, headers: t.idem() });
  const path = `/mgmt/v1/customers/${created.body.data.public_id}`;
  const response = await t.call("PATCH", path, { body: { name: "Acme\r\nX-Injected: 1" } });
  expect(response.status).toBe(422);
  expect((await t.call("GET", path)).body.data.name).toBe("Acme");
});
