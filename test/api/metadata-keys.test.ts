import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * Metadata keys are 1-64 characters on every object that carries metadata (licenses, resellers):
 * TypeBox's Record does not check its key schema, so the rule is enforced by the services.
 */
let t: TestContext;
let base: { product_id: string; policy_id: string };
beforeEach(() => {
  t = createTestContext();
  const catalog = factories(t).catalog();
  base = { product_id: catalog.product.id, policy_id: catalog.policy.id };
});
afterEach(() => t.close());

const LONG = "k".repeat(65);
const BAD = { [LONG]: 1, "": 2, fine: 3 };
const BAD_FIELDS = ["metadata.", `metadata.${LONG}`];
const count = (table: string) =>
  t.deps.sqlite.query<{ n: number }, []>(`SELECT count(*) AS n FROM ${table}`).get()?.n ?? 0;
const fields = (response: { body: { error: { details: { errors: Record<string, string[]> } } } }) =>
  Object.keys(response.body.error.details.errors).sort();

describe("licenses", () => {
  test("a license whose metadata has an empty or a 65-character key is refused with 422 and not stored", async () => {
    const response = await t.call("POST", "/mgmt/v1/licenses", {
      body: { ...base, metadata: BAD },
      headers: t.idem(),
    });
    expect(response.status).toBe(422);
    expect(fields(response)).toEqual(BAD_FIELDS);
    expect(response.body.error.details.errors[`metadata.${LONG}`]).toEqual(["keys are 1-64 characters"]);
    expect(count("licenses")).toBe(0);
    expect(count("audit_events")).toBe(0);
  });

  test("a PATCH with such metadata is refused and leaves the license and its version as they were", async () => {
    const created = await t.call("POST", "/mgmt/v1/licenses", {
      body: { ...base, metadata: { a: 1 } },
      headers: t.idem(),
    });
    const id = created.body.data.public_id;
    const events = count("audit_events");
    const response = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { metadata: BAD } });
    expect(response.status).toBe(422);
    expect(fields(response)).toEqual(BAD_FIELDS);
    expect((await t.call("GET", `/mgmt/v1/licenses/${id}`)).body.data).toEqual(created.body.data);
    expect(count("audit_events")).toBe(events);
  });

  test("metadata over 16 KiB as JSON is refused with 422 keyed metadata; 16 KiB is taken", async () => {
    // {"note":"xx…"} of exactly `bytes` bytes.
    const sized = (bytes: number) => ({ note: "x".repeat(bytes - 11) });
    expect(Buffer.byteLength(JSON.stringify(sized(16_385)))).toBe(16_385);
    const refused = await t.call("POST", "/mgmt/v1/licenses", {
      body: { ...base, metadata: sized(16_385) },
      headers: t.idem(),
    });
    expect([refused.status, refused.body.error.details.errors]).toEqual([
      422,
      { metadata: ["at most 16384 bytes as JSON"] },
    ]);
    expect(count("licenses")).toBe(0);
    const taken = await t.call("POST", "/mgmt/v1/licenses", {
      body: { ...base, metadata: sized(16_384) },
      headers: t.idem(),
    });
    expect(taken.status).toBe(201);
  });

  test("a 64-character key, counted in characters, not UTF-16 units, is accepted", async () => {
    const metadata = { ["k".repeat(64)]: 1, ["😀".repeat(64)]: 2 };
    const response = await t.call("POST", "/mgmt/v1/licenses", {
      body: { ...base, metadata },
      headers: t.idem(),
    });
    expect(response.status).toBe(201);
    expect(response.body.data.metadata).toEqual(metadata);
  });
});

describe("resellers", () => {
  test("a reseller whose metadata has an empty or a 65-character key is refused with 422 and not stored", async () => {
    const response = await t.call("POST", "/mgmt/v1/resellers", { body: { name: "R", metadata: BAD } });
    expect(response.status).toBe(422);
    expect(fields(response)).toEqual(BAD_FIELDS);
    expect(count("resellers")).toBe(0);
  });

  test("a reseller PATCH with such metadata is refused and changes nothing", async () => {
    const created = await t.call("POST", "/mgmt/v1/resellers", { body: { name: "R", metadata: { a: 1 } } });
    const id = created.body.data.public_id;
    const events = count("audit_events");
    const response = await t.call("PATCH", `/mgmt/v1/resellers/${id}`, {
      body: { name: "Renamed", metadata: { [LONG]: true } },
    });
    expect(response.status).toBe(422);
    expect(fields(response)).toEqual([`metadata.${LONG}`]);
    expect((await t.call("GET", `/mgmt/v1/resellers/${id}`)).body.data).toEqual(created.body.data);
    expect(count("audit_events")).toBe(events);
  });
});
