import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

describe("happy path", () => {
  test("a reseller is created with defaults and read back", async () => {
    const created = await t.call("POST", "/mgmt/v1/resellers", {
      body: {
        name: "Acme Resale",
        email: "sales@acme.test",
        organization_limit: 10,
        metadata: { region: "eu" },
      },
    });
    expect(created.status).toBe(201);
    expect(created.body.data).toMatchObject({
      name: "Acme Resale",
      status: "active",
      organization_limit: 10,
      user_limit: null,
      metadata: { region: "eu" },
      archived_at: null,
    });
    const read = await t.call("GET", `/mgmt/v1/resellers/${created.body.data.public_id}`, {
      key: t.keys.test,
    });
    expect(read.body.data).toEqual(created.body.data);
  });

  test("archiving through status sets archived_at and moving back clears it", async () => {
    const id = (await t.call("POST", "/mgmt/v1/resellers", { body: { name: "R" } })).body.data.public_id;
    const archived = await t.call("PATCH", `/mgmt/v1/resellers/${id}`, { body: { status: "archived" } });
    expect(archived.body.data.archived_at).not.toBeNull();
    const back = await t.call("PATCH", `/mgmt/v1/resellers/${id}`, {
      body: { status: "active", user_limit: 5 },
    });
    expect(back.body.data).toMatchObject({ status: "active", archived_at: null, user_limit: 5, name: "R" });
  });

  test("sending the same metadata again, in another key order, changes nothing: same ETag, no audit event", async () => {
    const created = await t.call("POST", "/mgmt/v1/resellers", {
      body: { name: "R", metadata: { region: "eu", tier: 2 } },
    });
    const path = `/mgmt/v1/resellers/${created.body.data.public_id}`;
    const events = () =>
      t.deps.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM audit_events").get()?.n;
    const before = events();
    const again = await t.call("PATCH", path, { body: { metadata: { tier: 2, region: "eu" } } });
    expect(again.status).toBe(200);
    expect(again.headers.get("etag")).toBe(created.headers.get("etag"));
    expect(events()).toBe(before);
    const changed = await t.call("PATCH", path, { body: { metadata: { region: "us", tier: 2 } } });
    expect(changed.headers.get("etag")).not.toBe(created.headers.get("etag"));
    expect(events()).toBe((before ?? 0) + 1);
  });

  test("reseller.updated lists the changed fields by their API names, as the reseller object shows them", async () => {
    const id = (await t.call("POST", "/mgmt/v1/resellers", { body: { name: "R" } })).body.data.public_id;
    const changed = await t.call("PATCH", `/mgmt/v1/resellers/${id}`, {
      body: {
        name: "R2",
        email: "sales@acme.test",
        external_ref: "crm-1",
        organization_limit: 3,
        user_limit: 4,
        metadata: { region: "eu" },
        status: "archived",
      },
    });
    expect(changed.status).toBe(200);
    const events = (await t.call("GET", "/mgmt/v1/events")).body.data as {
      type: string;
      target: { id: string };
      data: { changes?: string[] };
    }[];
    const updated = events.find((e) => e.type === "reseller.updated" && e.target.id === id);
    expect(updated?.data.changes?.sort()).toEqual(
      ["email", "external_ref", "metadata", "name", "organization_limit", "status", "user_limit"].sort(),
    );
    // Every name it lists is a field of the reseller object.
    for (const name of updated?.data.changes ?? []) expect(Object.keys(changed.body.data)).toContain(name);
  });

  test("an optional Idempotency-Key replays the first create", async () => {
    const headers = { "idempotency-key": "reseller-create-0001" };
    const a = await t.call("POST", "/mgmt/v1/resellers", { body: { name: "R" }, headers });
    const b = await t.call("POST", "/mgmt/v1/resellers", { body: { name: "R" }, headers });
    expect(b.body.data.public_id).toBe(a.body.data.public_id);
    expect((await t.call("GET", "/mgmt/v1/resellers")).body.data).toHaveLength(1);
  });
});

describe("errors", () => {
  test("bad values answer 422 keyed by field", async () => {
    const response = await t.call("POST", "/mgmt/v1/resellers", {
      body: { name: "", email: "nope", user_limit: -1, status: "gone" },
    });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors).sort()).toEqual([
      "email",
      "name",
      "status",
      "user_limit",
    ]);
  });

  test("an address is stored as customers' are: domain lower-cased, an IDN as punycode, and a form the full check refuses answers 422", async () => {
    const created = await t.call("POST", "/mgmt/v1/resellers", {
      body: { name: "R", email: "Sales@Bücher.Example" },
    });
    expect(created.body.data.email).toBe("Sales@xn--bcher-kva.example");
    const id = created.body.data.public_id;
    const etag = created.headers.get("etag");
    const same = await t.call("PATCH", `/mgmt/v1/resellers/${id}`, {
      body: { email: "Sales@bücher.example" },
    });
    expect(same.headers.get("etag")).toBe(etag);
    for (const email of ["a@b.123", "a@-bad-.example"]) {
      const refused = await t.call("PATCH", `/mgmt/v1/resellers/${id}`, { body: { email } });
      expect([email, refused.status, Object.keys(refused.body.error.details.errors)]).toEqual([
        email,
        422,
        ["email"],
      ]);
    }
    expect((await t.call("GET", `/mgmt/v1/resellers/${id}`)).body.data.email).toBe(
      "Sales@xn--bcher-kva.example",
    );
  });

  test("an unknown reseller answers 404", async () => {
    const response = await t.call("PATCH", "/mgmt/v1/resellers/rsl_01M81Z00000000000000000000", {
      body: { name: "X" },
    });
    expect(response.status).toBe(404);
  });
});
