import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * docs/api.md "Pagination": a cursor is opaque, short and URL-safe, and one the listing did not
 * issue answers 400. The shared suite (security.test.ts) tries every list with cursors minted for
 * other listings; these go through the API only, as a client would.
 */
let t: TestContext;
let f: ReturnType<typeof factories>;
beforeEach(() => {
  t = createTestContext();
  f = factories(t);
});
afterEach(() => t.close());

const list = (path: string, key?: string) => t.call("GET", path, { key });
const cursorOf = async (path: string, key?: string): Promise<string> => {
  const page = await list(path, key);
  expect(page.status).toBe(200);
  expect(page.body.pagination.has_more).toBe(true);
  return page.body.pagination.next_cursor;
};
const expectRefused = (response: Awaited<ReturnType<TestContext["call"]>>) => {
  expect(response.status).toBe(400);
  expect(response.body.error.code).toBe("INVALID_REQUEST");
};

describe("cursors", () => {
  test("a cursor is short and URL-safe and pages through every product exactly once", async () => {
    const made = [f.product(), f.product(), f.product()].map((p) => p.id);
    const cursor = await cursorOf("/mgmt/v1/products?limit=2");
    expect(cursor).toMatch(/^[A-Za-z0-9_-]{44}$/);
    const rest = await list(`/mgmt/v1/products?limit=2&cursor=${cursor}`);
    expect(rest.status).toBe(200);
    expect(rest.body.data.map((p: { public_id: string }) => p.public_id)).toEqual([made[0]]);
  });

  test("a forged cursor naming a real position answers 400, in base64url or standard base64", async () => {
    const [oldest] = [f.product(), f.product()];
    for (const json of [{ before: oldest?.id }, { before: `prod_${"Z".repeat(26)}` }]) {
      const text = JSON.stringify(json);
      for (const cursor of [Buffer.from(text).toString("base64url"), Buffer.from(text).toString("base64")]) {
        expectRefused(await list(`/mgmt/v1/products?cursor=${encodeURIComponent(cursor)}`));
      }
    }
    const genuine = await cursorOf("/mgmt/v1/products?limit=1");
    const standard = `${Buffer.from(genuine, "base64url").toString("base64")}=`;
    expectRefused(await list(`/mgmt/v1/products?limit=1&cursor=${encodeURIComponent(standard)}`));
  });

  test("a cursor of any length the listing did not issue answers 400 INVALID_REQUEST with details.cursor, never 422", async () => {
    f.product();
    f.product();
    const genuine = await cursorOf("/mgmt/v1/products?limit=1");
    const cursors = [
      genuine.slice(0, -1),
      `${genuine}A`,
      genuine.repeat(2),
      "A".repeat(512),
      "A".repeat(513),
      "A".repeat(4000),
      `${genuine}${"_".repeat(600)}`,
    ];
    for (const cursor of cursors) {
      const response = await list(`/mgmt/v1/products?limit=1&cursor=${cursor}`);
      expect({ length: cursor.length, status: response.status }).toEqual({
        length: cursor.length,
        status: 400,
      });
      expect(response.body.error).toMatchObject({ code: "INVALID_REQUEST", details: { cursor } });
    }
  });

  test("a cursor of the live listing answers 400 to a test key", async () => {
    f.product();
    f.product();
    f.product({ environment: "test" });
    const cursor = await cursorOf("/mgmt/v1/products?limit=1");
    expect((await list(`/mgmt/v1/products?limit=1&cursor=${cursor}`)).status).toBe(200);
    expectRefused(await list(`/mgmt/v1/products?limit=1&cursor=${cursor}`, t.keys.test));
  });

  test("a cursor of one license's devices answers 400 on another license's", async () => {
    const { product, policy } = f.catalog();
    const [a, b] = [1, 2].map(() => f.license({ productId: product.id, policyId: policy.id }).row.id);
    for (const licenseId of [a, b, a, b])
      f.activation({ productId: product.id, licenseId: licenseId as string });
    const cursor = await cursorOf(`/mgmt/v1/licenses/${a}/activations?limit=1`);
    expect((await list(`/mgmt/v1/licenses/${a}/activations?limit=1&cursor=${cursor}`)).status).toBe(200);
    expectRefused(await list(`/mgmt/v1/licenses/${b}/activations?limit=1&cursor=${cursor}`));
  });

  test("a cursor is tied to the filters it was issued with", async () => {
    const { product, policy } = f.catalog();
    const other = f.catalog();
    for (let i = 0; i < 2; i++) {
      f.license({ productId: product.id, policyId: policy.id });
      f.license({ productId: other.product.id, policyId: other.policy.id });
    }
    const filtered = `/mgmt/v1/licenses?limit=1&product_id=${product.id}`;
    const cursor = await cursorOf(filtered);
    const next = await list(`${filtered}&cursor=${cursor}`);
    expect(next.status).toBe(200);
    expect(next.body.data.map((l: { product_id: string }) => l.product_id)).toEqual([product.id]);
    expectRefused(await list(`/mgmt/v1/licenses?limit=1&product_id=${other.product.id}&cursor=${cursor}`));
    expectRefused(await list(`/mgmt/v1/licenses?limit=1&cursor=${cursor}`));
  });
});
