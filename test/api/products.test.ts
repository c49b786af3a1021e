import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const create = (body: Record<string, unknown>, key?: string) =>
  t.call("POST", "/mgmt/v1/products", { body, key, headers: t.idem() });
const body = (code = "desk") => ({ name: "Desk App", code, environment: "live" });

describe("happy path", () => {
  test("creating a product returns it with version 1, its signing keys ready and an ETag", async () => {
    const response = await create({ ...body(), description: "Desktop app" });
    expect(response.status).toBe(201);
    expect(response.body.data).toMatchObject({
      name: "Desk App",
      code: "desk",
      description: "Desktop app",
      environment: "live",
      status: "active",
      version: 1,
      trust_bundle_sequence: 1,
      signing_status: "ready",
    });
    expect(response.body.data.public_id).toMatch(/^prod_[0-9A-Z]{26}$/);
    expect(response.headers.get("etag")).toBe('"1"');
  });

  test("an update changes only the fields sent and bumps the version", async () => {
    const id = (await create({ ...body(), description: "keep me" })).body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/products/${id}`, {
      body: { name: "Renamed" },
      headers: { "if-match": "1" },
    });
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({
      name: "Renamed",
      description: "keep me",
      code: "desk",
      version: 2,
    });
    expect(response.headers.get("etag")).toBe('"2"');
    const quoted = await t.call("PATCH", `/mgmt/v1/products/${id}`, {
      body: { code: "desk-2" },
      headers: { "if-match": '"2"' },
    });
    expect(quoted.body.data.version).toBe(3);
  });

  test("an update that changes nothing keeps the version", async () => {
    const id = (await create(body())).body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/products/${id}`, { body: { name: "Desk App" } });
    expect(response.body.data.version).toBe(1);
  });

  test("archiving answers 204, keeps the product readable, and is harmless to repeat", async () => {
    const id = (await create(body())).body.data.public_id;
    expect((await t.call("DELETE", `/mgmt/v1/products/${id}`, { headers: { "if-match": "1" } })).status).toBe(
      204,
    );
    const got = await t.call("GET", `/mgmt/v1/products/${id}`);
    expect(got.body.data).toMatchObject({ status: "archived", version: 2 });
    expect((await t.call("DELETE", `/mgmt/v1/products/${id}`)).status).toBe(204);
    expect((await t.call("GET", `/mgmt/v1/products/${id}`)).body.data.version).toBe(2);
  });

  test("lists are newest first and page through every product exactly once", async () => {
    const created: string[] = [];
    for (let i = 0; i < 7; i++) created.push((await create(body(`p${i}`))).body.data.public_id);
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const query: string = cursor ? `?limit=3&cursor=${cursor}` : "?limit=3";
      const page = await t.call("GET", `/mgmt/v1/products${query}`);
      expect(page.status).toBe(200);
      expect(page.body.data.length).toBeLessThanOrEqual(3);
      seen.push(...page.body.data.map((p: { public_id: string }) => p.public_id));
      cursor = page.body.pagination.next_cursor;
      expect(page.body.pagination.has_more).toBe(cursor !== null);
    } while (cursor);
    expect(seen).toEqual([...created].reverse());
  });

  test("a key lists only its own environment's products", async () => {
    await create(body("live-one"));
    await create({ name: "T", code: "test-one", environment: "test" }, t.keys.test);
    const live = await t.call("GET", "/mgmt/v1/products");
    expect(live.body.data.map((p: { code: string }) => p.code)).toEqual(["live-one"]);
  });
});

describe("errors", () => {
  test("a code already used in the environment answers 422 keyed by code", async () => {
    await create(body());
    const response = await create(body());
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.code).toBeDefined();
  });

  test("the same code may exist in the other environment", async () => {
    await create(body());
    const response = await create({ ...body(), environment: "test" }, t.keys.test);
    expect(response.status).toBe(201);
  });

  test("a live key creating a test product answers 403 ENVIRONMENT_MISMATCH", async () => {
    const response = await create({ ...body(), environment: "test" });
    expect(response.status).toBe(403);
    expect(response.body.error.code).toBe("ENVIRONMENT_MISMATCH");
  });

  test("without an environment a product takes its key's", async () => {
    const live = await create({ name: "Desk App", code: "desk" });
    const test = await create({ name: "Desk App", code: "desk" }, t.keys.test);
    expect([live.status, test.status]).toEqual([201, 201]);
    expect(live.body.data.environment).toBe("live");
    expect(test.body.data.environment).toBe("test");
  });

  test("missing required fields and bad values answer 422 with every field listed", async () => {
    const response = await create({ name: "", code: "Bad Code!", environment: "staging" });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors).sort()).toEqual(["code", "environment", "name"]);
  });

  test("a stale If-Match returns 409 and changes nothing", async () => {
    const id = (await create(body())).body.data.public_id;
    await t.call("PATCH", `/mgmt/v1/products/${id}`, { body: { name: "Second" } });
    const stale = await t.call("PATCH", `/mgmt/v1/products/${id}`, {
      body: { name: "Lost" },
      headers: { "if-match": "1" },
    });
    expect(stale.status).toBe(409);
    expect(stale.body.error).toMatchObject({ code: "VERSION_CONFLICT", details: { current_etag: '"2"' } });
    const got = await t.call("GET", `/mgmt/v1/products/${id}`);
    expect(got.body.data).toMatchObject({ name: "Second", version: 2 });
  });

  test("a stale If-Match on archive returns 409 and the product stays active", async () => {
    const id = (await create(body())).body.data.public_id;
    const response = await t.call("DELETE", `/mgmt/v1/products/${id}`, { headers: { "if-match": "7" } });
    expect(response.status).toBe(409);
    expect((await t.call("GET", `/mgmt/v1/products/${id}`)).body.data.status).toBe("active");
  });

  test("a malformed If-Match answers 400", async () => {
    const id = (await create(body())).body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/products/${id}`, {
      body: { name: "X" },
      headers: { "if-match": "abc" },
    });
    expect(response.status).toBe(400);
  });

  test("changing an archived product answers 409 PRODUCT_ARCHIVED", async () => {
    const id = (await create(body())).body.data.public_id;
    await t.call("DELETE", `/mgmt/v1/products/${id}`);
    const response = await t.call("PATCH", `/mgmt/v1/products/${id}`, { body: { name: "X" } });
    expect(response.status).toBe(409);
    expect(response.body.error.code).toBe("PRODUCT_ARCHIVED");
  });

  test("changing the environment answers 422", async () => {
    const id = (await create(body())).body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/products/${id}`, { body: { environment: "test" } });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.environment).toBeDefined();
  });

  test("a limit outside 1..200 answers 422, and one not in decimal digits or a forged cursor 400", async () => {
    for (const limit of ["0", "201"]) {
      const response = await t.call("GET", `/mgmt/v1/products?limit=${limit}`);
      expect(response.status).toBe(422);
      expect(response.body.error.details.errors.limit).toBeDefined();
    }
    for (const limit of ["abc", "1.5"]) {
      const response = await t.call("GET", `/mgmt/v1/products?limit=${limit}`);
      expect(response.status).toBe(400);
      expect(response.body.error.details.limit).toBe(limit);
    }
    for (const cursor of ["garbage", Buffer.from('{"before":"lic_X"}').toString("base64url")]) {
      const response = await t.call("GET", `/mgmt/v1/products?cursor=${cursor}`);
      expect(response.status).toBe(400);
    }
  });
});
