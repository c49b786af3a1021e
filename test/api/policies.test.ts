import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { factories } from "../support/factories.ts";
import { BASE_URL, type CallResult, createTestContext, type TestContext } from "../support/harness.ts";

let t: TestContext;
let productId: string;
beforeEach(() => {
  t = createTestContext();
  productId = factories(t).product().id;
});
afterEach(() => t.close());

const create = (body: Record<string, unknown>) =>
  t.call("POST", "/mgmt/v1/policies", { body, headers: t.idem() });

describe("happy path", () => {
  test("a policy made from product_id and name alone gets the plan's defaults and works", async () => {
    const response = await create({ product_id: productId, name: "Standard" });
    expect(response.status).toBe(201);
    const plan = t.workspace.plan();
    expect(response.body.data).toMatchObject({
      product_id: productId,
      name: "Standard",
      version: 1,
      status: "active",
      license_type: "perpetual",
      perpetual_mode: "managed",
      identity_mode: "device",
      fail_mode: "open",
      heartbeat_sec: plan.policy_defaults.heartbeat_sec,
      cert_ttl_sec: plan.policy_defaults.cert_ttl_sec,
      network_grace_sec: plan.policy_defaults.network_grace_sec,
      max_machines: 1,
      max_concurrent: null,
      fingerprint_profile: { name: "standard" },
    });
    expect(response.body.data.revocation_guarantee_sec).toBe(
      plan.policy_defaults.cert_ttl_sec + plan.policy_defaults.network_grace_sec,
    );
    expect(response.headers.get("etag")).toMatch(/^"[0-9a-f]{24}"$/);
  });

  test("the kind decides the rest: a trial runs 14 days, a subscription bills yearly", async () => {
    const trial = await create({ product_id: productId, name: "Trial", license_type: "trial" });
    expect(trial.body.data).toMatchObject({
      trial_days: 14,
      heartbeat_required: true,
      billing_cycle: "none",
    });
    const sub = await create({ product_id: productId, name: "Sub", license_type: "subscription" });
    expect(sub.body.data).toMatchObject({ billing_cycle: "yearly", heartbeat_required: true });
  });

  test("an update with the ETag changes only what was sent and bumps the historical version", async () => {
    const created = await create({ product_id: productId, name: "Std", max_machines: 3 });
    const id = created.body.data.public_id;
    const etag = (await t.call("GET", `/mgmt/v1/policies/${id}`)).headers.get("etag") ?? "";
    expect(etag).toBe(created.headers.get("etag") ?? "");
    const response = await t.call("PATCH", `/mgmt/v1/policies/${id}`, {
      body: { heartbeat_sec: 7200, entitlements: { pro: true } },
      headers: { "if-match": etag },
    });
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({
      heartbeat_sec: 7200,
      max_machines: 3,
      version: 2,
      entitlements: { pro: true },
    });
    expect(response.headers.get("etag")).not.toBe(etag);
  });

  test("retiring answers 204, and a retired policy can no longer change", async () => {
    const id = (await create({ product_id: productId, name: "Old" })).body.data.public_id;
    expect((await t.call("DELETE", `/mgmt/v1/policies/${id}`)).status).toBe(204);
    expect((await t.call("GET", `/mgmt/v1/policies/${id}`)).body.data.status).toBe("retired");
    expect((await t.call("DELETE", `/mgmt/v1/policies/${id}`)).status).toBe(204);
    const change = await t.call("PATCH", `/mgmt/v1/policies/${id}`, { body: { name: "New" } });
    expect(change.status).toBe(422);
    expect(change.body.error.code).toBe("INVALID_TRANSITION");
  });

  test("the list can be narrowed to one product", async () => {
    const other = factories(t).product().id;
    await create({ product_id: productId, name: "A" });
    await create({ product_id: other, name: "B" });
    const response = await t.call("GET", `/mgmt/v1/policies?product_id=${other}`);
    expect(response.body.data.map((p: { name: string }) => p.name)).toEqual(["B"]);
  });
});

describe("errors", () => {
  test("sending the policy's version number as If-Match is a stale tag: 409 and nothing changes", async () => {
    const id = (await create({ product_id: productId, name: "Std" })).body.data.public_id;
    for (const ifMatch of ["1", '"1"']) {
      const response = await t.call("PATCH", `/mgmt/v1/policies/${id}`, {
        body: { name: "X" },
        headers: { "if-match": ifMatch },
      });
      expect(response.status).toBe(409);
      expect(response.body.error.code).toBe("VERSION_CONFLICT");
    }
    expect((await t.call("GET", `/mgmt/v1/policies/${id}`)).body.data).toMatchObject({
      name: "Std",
      version: 1,
    });
  });

  test("numbers outside the plan's constraints answer 422 keyed by field", async () => {
    // A plan narrower than the loosest one: its bounds lie inside the request schema's, which the
    // service then checks all together (the schema's own bounds are refused first, see below).
    t.workspace.setPlan("free");
    const c = t.workspace.plan().policy_constraints;
    const response = await create({
      product_id: productId,
      name: "Bad",
      heartbeat_sec: c.activation_sync_min_sec - 1,
      cert_ttl_sec: c.cert_ttl_max_sec + 1,
      lease_ttl_sec: 600,
      lease_heartbeat_sec: 600,
    });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors)).toEqual(
      expect.arrayContaining(["heartbeat_sec", "cert_ttl_sec", "lease_heartbeat_sec"]),
    );
  });

  test("numbers outside the bounds every plan keeps answer 422 keyed by field", async () => {
    const response = await create({
      product_id: productId,
      name: "Bad",
      max_machines: 0,
      cert_ttl_sec: 299,
      network_grace_sec: 90 * 86_400 + 1,
    });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors).sort()).toEqual([
      "cert_ttl_sec",
      "max_machines",
      "network_grace_sec",
    ]);
  });

  test("a smaller plan's constraints apply once the plan changes", async () => {
    t.workspace.setPlan("free");
    const response = await create({ product_id: productId, name: "Fast", heartbeat_sec: 600 });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.heartbeat_sec[0]).toContain("activation_sync_min_sec");
    const defaults = await create({ product_id: productId, name: "Defaults" });
    expect(defaults.status).toBe(201);
  });

  test("an update is validated against the merged result", async () => {
    const id = (await create({ product_id: productId, name: "Std" })).body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/policies/${id}`, {
      body: { heartbeat_sec: 10 * 86_400 },
    });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.heartbeat_sec).toBeDefined();
  });

  test("an unknown enum value lists the allowed values", async () => {
    const response = await create({ product_id: productId, name: "X", fail_mode: "sideways" });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.fail_mode).toEqual(["must be one of: open, closed"]);
  });

  test("an unmanaged perpetual_mode on a subscription answers 422", async () => {
    const response = await create({
      product_id: productId,
      name: "X",
      license_type: "subscription",
      perpetual_mode: "unmanaged",
    });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.perpetual_mode).toBeDefined();
  });

  test("a product that does not exist for this key is a field error; an archived one is 409", async () => {
    const testProduct = factories(t).product({ environment: "test" }).id;
    const unknown = await create({ product_id: testProduct, name: "X" });
    expect(unknown.status).toBe(422);
    expect(unknown.body.error.details.errors.product_id).toBeDefined();
    const archived = factories(t).product({ status: "archived" }).id;
    const response = await create({ product_id: archived, name: "X" });
    expect(response.status).toBe(409);
    expect(response.body.error.code).toBe("PRODUCT_ARCHIVED");
  });

  test("moving a policy to another product answers 422", async () => {
    const id = (await create({ product_id: productId, name: "Std" })).body.data.public_id;
    const other = factories(t).product().id;
    const response = await t.call("PATCH", `/mgmt/v1/policies/${id}`, { body: { product_id: other } });
    expect(response.status).toBe(422);
  });

  test("license_type cannot change once licenses use the policy", async () => {
    const id = (await create({ product_id: productId, name: "Std" })).body.data.public_id;
    expect(
      (
        await t.call("PATCH", `/mgmt/v1/policies/${id}`, {
          body: { license_type: "subscription", billing_cycle: "yearly" },
        })
      ).status,
    ).toBe(200);
    factories(t).license({ productId, policyId: id, licenseType: "subscription" });
    const response = await t.call("PATCH", `/mgmt/v1/policies/${id}`, {
      body: { license_type: "perpetual", billing_cycle: "none" },
    });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.license_type).toBeDefined();
  });

  test("resending the same entitlements in another key order changes nothing", async () => {
    const created = await create({
      product_id: productId,
      name: "Std",
      entitlements: { a: true, b: { max: 2 } },
    });
    const id = created.body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/policies/${id}`, {
      body: { entitlements: { b: { max: 2 }, a: true } },
    });
    expect(response.body.data.version).toBe(1);
    expect(response.headers.get("etag")).toBe(created.headers.get("etag"));
  });

  test("entitlement values beyond I-JSON (fractions, 1e308, 2^53 + 1) answer 422 by path and store nothing", async () => {
    const raw = (entitlements: string) =>
      `{"product_id":"${productId}","name":"X","entitlements":${entitlements}}`;
    const response = await t.call("POST", "/mgmt/v1/policies", {
      rawBody: raw('{"seats":1.5,"big":1e308,"n":9007199254740993,"ok":9007199254740991}'),
      headers: { "content-type": "application/json", ...t.idem() },
    });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors).sort()).toEqual([
      "entitlements.big",
      "entitlements.n",
      "entitlements.seats",
    ]);
    expect(t.deps.sqlite.query("SELECT count(*) AS n FROM policies").get()).toEqual({ n: 0 });

    const created = await create({ product_id: productId, name: "Std", entitlements: { seats: 5 } });
    const id = created.body.data.public_id;
    const patched = await t.call("PATCH", `/mgmt/v1/policies/${id}`, {
      rawBody: '{"entitlements":{"limits":{"max":2.5}}}',
      headers: { "content-type": "application/json" },
    });
    expect(patched.status).toBe(422);
    expect(Object.keys(patched.body.error.details.errors)).toEqual(["entitlements.limits.max"]);
    const read = await t.call("GET", `/mgmt/v1/policies/${id}`);
    expect(read.body.data).toMatchObject({ version: 1, entitlements: { seats: 5 } });
    expect(read.headers.get("etag")).toBe(created.headers.get("etag"));
    const events = await t.call("GET", "/mgmt/v1/events");
    expect(events.body.data.map((e: { type: string }) => e.type)).toEqual(["policy.created"]);
  });

  test("integers sent as strings are refused, not coerced", async () => {
    const response = await create({ product_id: productId, name: "X", max_machines: "5" });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.max_machines).toBeDefined();
  });
});

describe("the documented bounds, as docs/api.md states them", () => {
  // Literal numbers on purpose: the OpenAPI test compares the schema with the constants it is
  // built from, so a wrong constant would pass it. On the default plan (self-hosted, the loosest)
  // the plan's own bounds are these too.
  const DAY = 86_400;
  const BOUNDS: { field: string; accepted: number[]; refused: number[]; with?: Record<string, unknown> }[] = [
    { field: "max_machines", accepted: [1, 1_000_000], refused: [0, 1_000_001] },
    { field: "max_concurrent", accepted: [1, 1_000_000], refused: [0, 1_000_001] },
    { field: "license_unit_limit", accepted: [1, 1_000_000], refused: [0, 1_000_001] },
    // No heartbeat longer than the certificate, and no grace on top of a year-long certificate
    // (the plan's revocation exposure is a year): only the bound itself decides.
    {
      field: "cert_ttl_sec",
      accepted: [300, 365 * DAY],
      refused: [299, 365 * DAY + 1],
      with: { heartbeat_sec: 60, network_grace_sec: 0 },
    },
    {
      field: "heartbeat_sec",
      accepted: [60, 30 * DAY],
      refused: [59, 30 * DAY + 1],
      with: { cert_ttl_sec: 365 * DAY, network_grace_sec: 0 },
    },
    {
      field: "lease_ttl_sec",
      accepted: [30, 7 * DAY],
      refused: [29, 7 * DAY + 1],
      with: { lease_heartbeat_sec: 10 },
    },
    // At most 7 days, and shorter than lease_ttl_sec, itself at most 7 days: 7 days is refused too.
    {
      field: "lease_heartbeat_sec",
      accepted: [10, 7 * DAY - 1],
      refused: [9, 7 * DAY, 7 * DAY + 1],
      with: { lease_ttl_sec: 7 * DAY },
    },
    { field: "network_grace_sec", accepted: [0, 90 * DAY], refused: [-1, 90 * DAY + 1] },
    { field: "trial_days", accepted: [0, 365], refused: [-1, 366] },
    { field: "trial_days", accepted: [1, 365], refused: [0, 366], with: { license_type: "trial" } },
  ];
  const policyCount = () =>
    t.deps.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM policies").get()?.n ?? 0;

  /** The error envelope of docs/errors.md, VALIDATION_FAILED, keyed by the one field alone. */
  const refusal = (response: CallResult) => {
    const error = response.body?.error ?? {};
    return {
      status: response.status,
      fields: Object.keys(error).sort(),
      code: error.code,
      retryable: error.retryable,
      doc_url: error.doc_url,
      request_id: error.request_id === response.headers.get("x-request-id"),
      details: Object.keys(error.details ?? {}),
      errors: Object.keys(error.details?.errors ?? {}),
    };
  };

  test("each number's lowest and highest value are accepted and stored, and one past either is refused with a 422 on that field", async () => {
    expect(t.workspace.plan().code).toBe("self_hosted");
    const before = policyCount();
    let accepted = 0;
    for (const { field, with: others, ...values } of BOUNDS) {
      for (const value of values.accepted) {
        const response = await create({
          product_id: productId,
          name: `${field} ${value}`,
          ...others,
          [field]: value,
        });
        expect({ field, value, status: response.status, stored: response.body.data?.[field] }).toEqual({
          field,
          value,
          status: 201,
          stored: value,
        });
        accepted++;
      }
      for (const value of values.refused) {
        const response = await create({
          product_id: productId,
          name: `${field} ${value}`,
          ...others,
          [field]: value,
        });
        expect({ field, value, ...refusal(response) }).toEqual({
          field,
          value,
          status: 422,
          fields: ["code", "details", "doc_url", "message", "request_id", "retryable"],
          code: "VALIDATION_FAILED",
          retryable: false,
          doc_url: `${BASE_URL}/docs/errors#VALIDATION_FAILED`,
          request_id: true,
          details: ["errors"],
          errors: [field],
        });
      }
    }
    // Only the accepted ones were stored.
    expect(policyCount()).toBe(before + accepted);
  });
});
