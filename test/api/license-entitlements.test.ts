import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * A license's entitlement overrides follow the policy's rules wherever they are written: license
 * create, PATCH and convert-trial. A refusal changes nothing: no row, no new version, no event.
 */
let t: TestContext;
let f: ReturnType<typeof factories>;
let productId: string;
let policyId: string;
let fullPolicyId: string;
beforeEach(() => {
  t = createTestContext();
  f = factories(t);
  const catalog = f.catalog("live", { entitlements: { export: true } });
  productId = catalog.product.id;
  policyId = catalog.policy.id;
  fullPolicyId = f.policy({ productId, licenseType: "subscription", billingCycle: "yearly" }).id;
});
afterEach(() => t.close());

const create = (body: Record<string, unknown>) =>
  t.call("POST", "/mgmt/v1/licenses", { body, headers: t.idem() });
const convert = (id: string, body: Record<string, unknown>) =>
  t.call("POST", `/mgmt/v1/licenses/${id}/convert-trial`, { body });

const stored = (id: string) =>
  t.deps.sqlite
    .query<{ entitlements: string; version: number; policy_id: string; license_type: string }, [string]>(
      "SELECT entitlements, version, policy_id, license_type FROM licenses WHERE id = ?",
    )
    .get(id);
const eventCount = () =>
  t.deps.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM audit_events").get()?.n ?? 0;

async function trialLicense(entitlements: Record<string, unknown> = {}) {
  const trialPolicy = f.policy({ productId, licenseType: "trial", trialDays: 14 });
  const response = await create({ product_id: productId, policy_id: trialPolicy.id, entitlements });
  expect(response.status).toBe(201);
  return response.body.data.public_id as string;
}

/** The refusal is 422 VALIDATION_FAILED with exactly these fields, and the trial is untouched. */
async function expectConvertRefused(id: string, body: Record<string, unknown>, fields: string[]) {
  const before = stored(id);
  const events = eventCount();
  const response = await convert(id, { target_policy_id: fullPolicyId, ...body });
  expect(response.status).toBe(422);
  expect(response.body.error.code).toBe("VALIDATION_FAILED");
  expect(Object.keys(response.body.error.details.errors).sort()).toEqual([...fields].sort());
  expect(stored(id)).toEqual(before);
  expect(before?.license_type).toBe("trial");
  expect(eventCount()).toBe(events);
  return response;
}

describe("convert-trial entitlement overrides", () => {
  test("a badly formed override name is refused with 422 keyed by its path and the trial stays as it was", async () => {
    const id = await trialLicense();
    await expectConvertRefused(id, { entitlement_overrides: { BAD: 1, "BAD NAME!!": true, good: true } }, [
      "entitlement_overrides.BAD",
      "entitlement_overrides.BAD NAME!!",
    ]);
  });

  test("the same names are refused by create, PATCH and convert-trial alike", async () => {
    const bad = { Pro: true };
    const created = await create({ product_id: productId, policy_id: policyId, entitlements: bad });
    expect(Object.keys(created.body.error.details.errors)).toEqual(["entitlements.Pro"]);
    const id = await trialLicense();
    const patched = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { entitlements: bad } });
    expect(Object.keys(patched.body.error.details.errors)).toEqual(["entitlements.Pro"]);
    const converted = await convert(id, { target_policy_id: fullPolicyId, entitlement_overrides: bad });
    expect(converted.status).toBe(422);
    expect(converted.body.error.details.errors["entitlement_overrides.Pro"]).toEqual(
      patched.body.error.details.errors["entitlements.Pro"],
    );
  });
});

const many = (count: number, prefix = "e") =>
  Object.fromEntries(Array.from({ length: count }, (_, i) => [`${prefix}${i}`, true]));
const licenseCount = () =>
  t.deps.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM licenses").get()?.n ?? 0;

describe("at most 200 entitlement overrides, as on a policy", () => {
  test("a license with 201 entitlement overrides is refused with 422 and nothing is stored", async () => {
    const response = await create({ product_id: productId, policy_id: policyId, entitlements: many(201) });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors).toEqual({ entitlements: ["at most 200 entitlements"] });
    expect(licenseCount()).toBe(0);
    expect(eventCount()).toBe(0);
    const policy = await t.call("POST", "/mgmt/v1/policies", {
      body: { product_id: productId, name: "Same map", entitlements: many(201) },
      headers: t.idem(),
    });
    expect(policy.body.error.details.errors).toEqual(response.body.error.details.errors);
    expect(
      (await create({ product_id: productId, policy_id: policyId, entitlements: many(200) })).status,
    ).toBe(201);
  });

  test("a PATCH with 201 entitlement overrides is refused and leaves the overrides and version as they were", async () => {
    const id = (await create({ product_id: productId, policy_id: policyId, entitlements: { pro: true } }))
      .body.data.public_id;
    const before = stored(id);
    const events = eventCount();
    const response = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { entitlements: many(201) } });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors).toEqual({ entitlements: ["at most 200 entitlements"] });
    expect(stored(id)).toEqual(before);
    expect(eventCount()).toBe(events);
  });

  test("an entitlement map over 8 KiB as JSON is refused on a license, a policy and a PATCH; one of 8 KiB is taken", async () => {
    // One entitlement whose value is a long array: {"big":[1,1,…]} of exactly `bytes` bytes.
    const sized = (bytes: number) => ({ big: Array.from({ length: (bytes - 9) / 2 }, () => 1) });
    expect(Buffer.byteLength(JSON.stringify(sized(8193)))).toBe(8193);
    const over = sized(8193);
    const refused = await create({ product_id: productId, policy_id: policyId, entitlements: over });
    expect([refused.status, refused.body.error.details.errors]).toEqual([
      422,
      { entitlements: ["at most 8192 bytes as JSON"] },
    ]);
    expect(licenseCount()).toBe(0);
    const policy = await t.call("POST", "/mgmt/v1/policies", {
      body: { product_id: productId, name: "Big map", entitlements: over },
      headers: t.idem(),
    });
    expect(policy.body.error.details.errors).toEqual(refused.body.error.details.errors);
    const id = (await create({ product_id: productId, policy_id: policyId, entitlements: sized(8191) })).body
      .data.public_id as string;
    const patched = await t.call("PATCH", `/mgmt/v1/licenses/${id}`, { body: { entitlements: over } });
    expect([patched.status, patched.body.error.details.errors]).toEqual([
      422,
      refused.body.error.details.errors,
    ]);
  });

  test("a policy whose map was stored over 8 KiB before the cap can still be renamed or changed; sending the map again is refused", async () => {
    const stored = { big: Array.from({ length: 5_000 }, () => 1) };
    t.deps.sqlite.run("UPDATE policies SET entitlements = ? WHERE id = ?", [
      JSON.stringify(stored),
      policyId,
    ]);
    const path = `/mgmt/v1/policies/${policyId}`;
    expect((await t.call("PATCH", path, { body: { name: "Renamed" } })).status).toBe(200);
    expect((await t.call("PATCH", path, { body: { max_machines: 7 } })).status).toBe(200);
    const resent = await t.call("PATCH", path, { body: { entitlements: { ...stored, more: true } } });
    expect([resent.status, resent.body.error.details.errors]).toEqual([
      422,
      { entitlements: ["at most 8192 bytes as JSON"] },
    ]);
  });

  test("convert-trial counts the trial's overrides and the new ones together, each name once", async () => {
    const id = await trialLicense(many(150));
    await expectConvertRefused(id, { entitlement_overrides: many(51, "n") }, ["entitlement_overrides"]);
    await expectConvertRefused(id, { entitlement_overrides: many(201, "n") }, ["entitlement_overrides"]);
    // 150 kept, 10 of them replaced, 50 new: 200 in all.
    const overlapping = { ...many(10), ...many(50, "n") };
    const response = await convert(id, {
      target_policy_id: fullPolicyId,
      entitlement_overrides: overlapping,
    });
    expect(response.status).toBe(200);
    expect(Object.keys(response.body.data.entitlement_overrides)).toHaveLength(200);
  });

  test("a trial stored with more than 200 overrides (before the cap) still converts when none are added", async () => {
    const trialPolicy = f.policy({ productId, licenseType: "trial", trialDays: 14 });
    const { row } = f.license({
      productId,
      policyId: trialPolicy.id,
      licenseType: "trial",
      entitlements: many(201),
    });
    const response = await convert(row.id, { target_policy_id: fullPolicyId });
    expect(response.status).toBe(200);
    await expectConvertRefused(
      f.license({ productId, policyId: trialPolicy.id, licenseType: "trial", entitlements: many(201) }).row
        .id,
      { entitlement_overrides: { extra: true } },
      ["entitlement_overrides"],
    );
  });
});

describe("entitlement values stay within I-JSON", () => {
  const raw = (body: string) => ({ rawBody: body, headers: { "content-type": "application/json" } });
  const BAD = '{"seats":1.5,"big":1e308,"n":9007199254740993,"ok":9007199254740991,"tier":"gold"}';
  const BAD_KEYS = (field: string) => [`${field}.big`, `${field}.n`, `${field}.seats`];

  test("a license whose overrides hold a fraction, 1e308 or 2^53 + 1 is refused by path and not stored", async () => {
    const response = await t.call("POST", "/mgmt/v1/licenses", {
      ...raw(`{"product_id":"${productId}","policy_id":"${policyId}","entitlements":${BAD}}`),
      headers: { "content-type": "application/json", ...t.idem() },
    });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors).sort()).toEqual(BAD_KEYS("entitlements"));
    expect(licenseCount()).toBe(0);
  });

  test("a PATCH with such a value is refused and changes nothing", async () => {
    const id = (await create({ product_id: productId, policy_id: policyId, entitlements: { seats: 3 } })).body
      .data.public_id;
    const before = stored(id);
    const events = eventCount();
    const response = await t.call(
      "PATCH",
      `/mgmt/v1/licenses/${id}`,
      raw('{"entitlements":{"seats":3,"limits":{"max":0.5}}}'),
    );
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors)).toEqual(["entitlements.limits.max"]);
    expect(stored(id)).toEqual(before);
    expect(eventCount()).toBe(events);
  });

  test("convert-trial refuses such values keyed entitlement_overrides and converts nothing", async () => {
    const id = await trialLicense({ seats: 1 });
    const before = stored(id);
    const response = await t.call(
      "POST",
      `/mgmt/v1/licenses/${id}/convert-trial`,
      raw(`{"target_policy_id":"${fullPolicyId}","entitlement_overrides":${BAD}}`),
    );
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors).sort()).toEqual(BAD_KEYS("entitlement_overrides"));
    expect(stored(id)).toEqual(before);
    const fine = await convert(id, {
      target_policy_id: fullPolicyId,
      entitlement_overrides: { seats: Number.MAX_SAFE_INTEGER, tier: "gold", pro: true },
    });
    expect(fine.status).toBe(200);
    expect(fine.body.data.entitlement_overrides).toEqual({
      seats: Number.MAX_SAFE_INTEGER,
      tier: "gold",
      pro: true,
    });
  });
});
