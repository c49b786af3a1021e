import { describe, expect, test } from "bun:test";
import { eq } from "drizzle-orm";
import { customerWithRef } from "../../src/modules/billing/buyers.ts";
import { customers, mailOutbox } from "../../src/store/schema/index.ts";
import {
  checkout,
  deliver,
  event,
  licensesOfCheckout,
  next,
  offering,
  t,
  useBillingContext,
} from "../support/billing.ts";

/**
 * Who a checkout's license goes to: the customer found or made from what the buyer typed into
 * Stripe's checkout (which Stripe does not check the way this API does), and the same customer
 * again when the buyer comes back.
 */
useBillingContext({ configured: true });

/** A completed checkout with these buyer details; answers the customer its license went to. */
async function bought(details: Record<string, unknown>, customer = next("cus")) {
  const session = { ...checkout(offering()), customer, customer_details: details };
  expect((await deliver(event("checkout.session.completed", session))).body.data.result).toBe("succeeded");
  const [license] = licensesOfCheckout(session.id);
  return license?.customerId ?? null;
}

const customerRow = (id: string | null) =>
  t.deps.db
    .select()
    .from(customers)
    .where(eq(customers.id, id ?? ""))
    .get();

describe("the buyer's details", () => {
  test("a name with terminal escape sequences, line breaks and 349 characters is stored as one line of 200 the API itself accepts", async () => {
    const typed = [
      "\u001b]8;;https://evil.example/\u001b\\Ada\u001b]8;;\u001b\\",
      "\n\u001b[31mLovelace\u001b[0m\tthe\u0007Third ",
      "y".repeat(282),
    ].join("");
    expect(typed.length).toBe(349);
    const id = await bought({ email: `${next("ada")}@example.com`, name: typed });
    const name = customerRow(id)?.name;
    expect(name).toBe(`Ada Lovelace the Third ${"y".repeat(177)}`);
    const same = await t.call("POST", "/mgmt/v1/customers", {
      key: t.keys.test,
      body: { name },
      headers: t.idem(),
    });
    expect(same.status).toBe(201);
  });

  test("a name with nothing left once cleaned is left out, and the address alone makes the customer", async () => {
    const email = `${next("blank")}@example.com`;
    const id = await bought({ email, name: "\u001b[2J\r\n\u0007 " });
    expect(customerRow(id)).toMatchObject({ name: null, email });
  });

  test("an address that is not a plain addr-spec is neither stored nor mailed, and the name alone makes the customer", async () => {
    const id = await bought({ email: "not-an-email", name: "Ada Buyer" });
    expect(customerRow(id)).toMatchObject({ name: "Ada Buyer", email: null });
    const mailed = t.deps.db.select().from(mailOutbox).where(eq(mailOutbox.recipient, "not-an-email")).all();
    expect(mailed).toEqual([]);
  });

  test("a NUL or a lone surrogate anywhere in the event does not refuse the purchase: the name is cleaned, the address with one dropped", async () => {
    const id = await bought({
      email: `ada\u0000${next("nul")}@example.com`,
      name: "Ada\u0000Lovelace \ud800",
      address: { line1: "\udc00 1 Main St\u0000" },
    });
    expect(customerRow(id)).toMatchObject({ name: "Ada Lovelace \ufffd", email: null });
  });

  test("on our own routes, a NUL is still refused with 422", async () => {
    const created = await t.call("POST", "/mgmt/v1/customers", {
      key: t.keys.test,
      body: { name: "Ada\u0000Lovelace" },
      headers: t.idem(),
    });
    expect([created.status, created.body.error.code]).toEqual([422, "VALIDATION_FAILED"]);
  });
});

describe("returning buyers", () => {
  test("a checkout without customer details goes to the customer that has the buyer's Stripe customer id", async () => {
    const stripeCustomer = next("cus");
    const first = await bought({ email: `${next("back")}@example.com`, name: "Ada Buyer" }, stripeCustomer);
    expect(first).not.toBeNull();
    expect(await bought({}, stripeCustomer)).toBe(first);
  });

  test("the buyer is found by the Stripe customer id through an index, not a scan of every customer", () => {
    const { sql, params } = customerWithRef(t.deps.db, "cus_seek").toSQL();
    const plan = t.deps.sqlite
      .query<{ detail: string }, (string | number)[]>(`EXPLAIN QUERY PLAN ${sql}`)
      .all(...(params as (string | number)[]))
      .map((step) => step.detail)
      .join(" | ");
    expect(plan).toBe("SEARCH customers USING INDEX customers_external_ref (external_ref=?)");
  });

  test("after the buyer's customer is archived, their next purchases share one new customer", async () => {
    const stripeCustomer = next("cus");
    const details = { email: `${next("again")}@example.com`, name: "Ada Buyer" };
    const archived = await bought(details, stripeCustomer);
    const archiving = await t.call("DELETE", `/mgmt/v1/customers/${archived}`, { key: t.keys.test });
    expect(archiving.status).toBe(204);
    const second = await bought(details, stripeCustomer);
    const third = await bought(details, stripeCustomer);
    expect(second).not.toBe(archived);
    expect(third).toBe(second);
    const withRef = t.deps.db.select().from(customers).where(eq(customers.externalRef, stripeCustomer)).all();
    expect(Object.fromEntries(withRef.map((row) => [row.id, row.status]))).toEqual({
      [archived as string]: "archived",
      [second as string]: "active",
    });
  });
});
