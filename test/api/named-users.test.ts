import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Secret, TOTP } from "otpauth";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { runtimeFixture } from "../support/runtime.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const auditCount = () =>
  (t.deps.sqlite.query("SELECT count(*) AS n FROM audit_events").get() as { n: number }).n;
const createUser = (body: Record<string, unknown>, key?: string) =>
  t.call("POST", "/mgmt/v1/license-users", { body, key });

const namedLicense = async (policy: Record<string, unknown> = {}) =>
  runtimeFixture(t, { policy: { identity_mode: "named_user", ...policy } });

describe("license users", () => {
  test("create, get (with ETag), list by email, update and disable", async () => {
    const created = await createUser({ email: "Ada@Example.com", name: "Ada", external_ref: "crm-1" });
    expect(created.status).toBe(201);
    const user = created.body.data;
    expect(user).toMatchObject({
      // The local part as typed, the domain lower-cased (src/domain/email-address.ts).
      email: "Ada@example.com",
      name: "Ada",
      external_ref: "crm-1",
      identity: "local",
      status: "active",
      environment: "live",
      two_factor: { status: "none", locked: false, recovery_codes_remaining: 0, passkeys: 0 },
    });
    expect(user.public_id).toStartWith("usr_");
    const got = await t.call("GET", `/mgmt/v1/license-users/${user.public_id}`);
    const etag = got.headers.get("etag") ?? "";
    expect(etag).not.toBe("");
    const listed = await t.call("GET", "/mgmt/v1/license-users?email=ada@EXAMPLE.com");
    expect(listed.body.data.map((u: { public_id: string }) => u.public_id)).toEqual([user.public_id]);
    const stale = await t.call("PATCH", `/mgmt/v1/license-users/${user.public_id}`, {
      body: { name: "Ada L." },
      headers: { "if-match": '"stale"' },
    });
    expect(stale.status).toBe(409);
    const updated = await t.call("PATCH", `/mgmt/v1/license-users/${user.public_id}`, {
      body: { name: "Ada L." },
      headers: { "if-match": etag },
    });
    expect(updated.status).toBe(200);
    expect(updated.body.data.name).toBe("Ada L.");
    expect((await t.call("DELETE", `/mgmt/v1/license-users/${user.public_id}`)).status).toBe(204);
    const disabled = await t.call("GET", `/mgmt/v1/license-users/${user.public_id}`);
    expect(disabled.body.data.status).toBe("disabled");
    expect(disabled.body.data.disabled_at).toBeString();
    const events = await t.call("GET", "/mgmt/v1/events");
    const types = events.body.data.map((e: { type: string }) => e.type);
    expect(types).toEqual(
      expect.arrayContaining(["license_user.created", "license_user.updated", "license_user.disabled"]),
    );
  });

  test("an active address is unique per environment, in any case; a disabled user frees it", async () => {
    const first = await createUser({ email: "ada@example.com" });
    const dup = await createUser({ email: " ADA@example.com " });
    expect(dup.status).toBe(422);
    expect(dup.body.error.details.errors.email).toBeDefined();
    // The other environment is separate.
    expect((await createUser({ email: "ada@example.com" }, t.keys.test)).status).toBe(201);
    await t.call("DELETE", `/mgmt/v1/license-users/${first.body.data.public_id}`);
    expect((await createUser({ email: "ada@example.com" })).status).toBe(201);
    // Enabling the first one again would make two: refused.
    const again = await t.call("PATCH", `/mgmt/v1/license-users/${first.body.data.public_id}`, {
      body: { status: "active" },
    });
    expect(again.status).toBe(422);
  });

  test("bad email, unknown customer and unknown fields are 422", async () => {
    expect((await createUser({ email: "not-an-address" })).status).toBe(422);
    expect((await createUser({})).status).toBe(422);
    const customer = await createUser({
      email: "c@example.com",
      customer_id: "cus_01M81Z00000000000000000000",
    });
    expect(customer.body.error.details.errors.customer_id).toBeDefined();
    expect((await createUser({ email: "x@example.com", role: "admin" })).status).toBe(422);
  });

  test("a user cannot be created for an archived customer: 422 keyed customer_id, no user, no event", async () => {
    const customer = await t.call("POST", "/mgmt/v1/customers", {
      body: { name: "Gone" },
      headers: t.idem(),
    });
    const customerId = customer.body.data.public_id;
    expect((await t.call("DELETE", `/mgmt/v1/customers/${customerId}`)).status).toBe(204);
    const events = auditCount();
    const response = await createUser({ email: "x@example.com", customer_id: customerId });
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("VALIDATION_FAILED");
    expect(response.body.error.details.errors.customer_id).toEqual(["is archived"]);
    expect((await t.call("GET", "/mgmt/v1/license-users")).body.data).toEqual([]);
    expect(auditCount()).toBe(events);
  });

  test("a PATCH cannot link a user to an archived customer; resending the link it already has changes nothing", async () => {
    const make = async (name: string) =>
      (await t.call("POST", "/mgmt/v1/customers", { body: { name }, headers: t.idem() })).body.data.public_id;
    const kept = await make("Kept");
    const gone = await make("Gone");
    const user = (await createUser({ email: "ada@example.com", customer_id: kept })).body.data.public_id;
    expect((await t.call("DELETE", `/mgmt/v1/customers/${gone}`)).status).toBe(204);
    const path = `/mgmt/v1/license-users/${user}`;
    const before = await t.call("GET", path);
    const events = auditCount();
    const linked = await t.call("PATCH", path, { body: { customer_id: gone, name: "Ada" } });
    expect(linked.status).toBe(422);
    expect(linked.body.error.details.errors.customer_id).toEqual(["is archived"]);
    const after = await t.call("GET", path);
    expect(after.body.data).toEqual(before.body.data);
    expect(after.headers.get("etag")).toBe(before.headers.get("etag"));
    expect(auditCount()).toBe(events);
    // A customer archived after the link was made does not block the user's other changes.
    expect((await t.call("DELETE", `/mgmt/v1/customers/${kept}`)).status).toBe(204);
    const renamed = await t.call("PATCH", path, { body: { customer_id: kept, name: "Ada L." } });
    expect(renamed.status).toBe(200);
    expect(renamed.body.data).toMatchObject({ customer_id: kept, name: "Ada L." });
  });
});

test("a page of users shows each one's own recovery codes left and passkeys (counted for the whole page at once)", async () => {
  const ids: string[] = [];
  for (let i = 0; i < 12; i++)
    ids.push((await createUser({ email: `user${i}@example.com` })).body.data.public_id);
  const now = t.clock.now();
  // User i holds i passkeys, and i recovery codes of which one is used; two-factor on for all.
  for (const [i, id] of ids.entries()) {
    t.deps.sqlite.run("UPDATE license_users SET totp_status = 'enabled' WHERE id = ?", [id]);
    for (let k = 0; k < i; k++) {
      t.deps.sqlite.run(
        "INSERT INTO passkeys (id, user_id, credential_id, public_key, sign_count, created_at) VALUES (?, ?, ?, '{}', 0, ?)",
        [`pk_${i}_${k}`, id, `cred_${i}_${k}`, now.getTime()],
      );
      t.deps.sqlite.run(
        "INSERT INTO two_factor_recovery_codes (user_id, code_hash, used_at) VALUES (?, ?, ?)",
        [id, `hash_${k}`, k === 0 ? now.getTime() : null],
      );
    }
  }
  const page = await t.call("GET", "/mgmt/v1/license-users?limit=12");
  const shown = new Map(
    page.body.data.map((u: { public_id: string; two_factor: Record<string, number> }) => [
      u.public_id,
      u.two_factor,
    ]),
  );
  for (const [i, id] of ids.entries())
    expect(shown.get(id)).toMatchObject({ passkeys: i, recovery_codes_remaining: Math.max(0, i - 1) });
});

describe("assignments", () => {
  test("assign, list by license and by user, remove", async () => {
    const f = await namedLicense();
    const user = (await createUser({ email: "ada@example.com" })).body.data.public_id;
    const assigned = await t.call("POST", `/mgmt/v1/licenses/${f.licenseId}/assignments`, {
      body: { user_id: user },
    });
    expect(assigned.status).toBe(201);
    expect(assigned.body.data).toMatchObject({
      license_id: f.licenseId,
      user_id: user,
      status: "active",
      removed_at: null,
    });
    const id = assigned.body.data.public_id;
    expect(id).toStartWith("asg_");
    expect((await t.call("GET", `/mgmt/v1/licenses/${f.licenseId}/assignments`)).body.data[0].public_id).toBe(
      id,
    );
    expect((await t.call("GET", `/mgmt/v1/license-users/${user}/assignments`)).body.data[0].public_id).toBe(
      id,
    );
    const twice = await t.call("POST", `/mgmt/v1/licenses/${f.licenseId}/assignments`, {
      body: { user_id: user },
    });
    expect(twice.status).toBe(422);
    expect((await t.call("DELETE", `/mgmt/v1/license-assignments/${id}`)).status).toBe(204);
    const active = await t.call("GET", `/mgmt/v1/licenses/${f.licenseId}/assignments?status=active`);
    expect(active.body.data).toEqual([]);
    const all = await t.call("GET", `/mgmt/v1/licenses/${f.licenseId}/assignments`);
    expect(all.body.data[0].status).toBe("removed");
    // Removing again changes nothing.
    expect((await t.call("DELETE", `/mgmt/v1/license-assignments/${id}`)).status).toBe(204);
  });

  test("only named-user licenses take assignments, within license_unit_limit, of active users of the same environment", async () => {
    const device = await runtimeFixture(t);
    const user = (await createUser({ email: "ada@example.com" })).body.data.public_id;
    const onDevice = await t.call("POST", `/mgmt/v1/licenses/${device.licenseId}/assignments`, {
      body: { user_id: user },
    });
    expect(onDevice.status).toBe(422);
    expect(onDevice.body.error.code).toBe("INVALID_TRANSITION");

    const f = await namedLicense({ license_unit_limit: 1 });
    const second = (await createUser({ email: "bob@example.com" })).body.data.public_id;
    expect(
      (await t.call("POST", `/mgmt/v1/licenses/${f.licenseId}/assignments`, { body: { user_id: user } }))
        .status,
    ).toBe(201);
    const full = await t.call("POST", `/mgmt/v1/licenses/${f.licenseId}/assignments`, {
      body: { user_id: second },
    });
    expect(full.status).toBe(422);
    expect(full.body.error.details.license_unit_limit).toBe(1);

    const testUser = (await createUser({ email: "eve@example.com" }, t.keys.test)).body.data.public_id;
    const g = await namedLicense();
    const cross = await t.call("POST", `/mgmt/v1/licenses/${g.licenseId}/assignments`, {
      body: { user_id: testUser },
    });
    expect(cross.status).toBe(422);
    expect(cross.body.error.details.errors.user_id).toBeDefined();
    await t.call("DELETE", `/mgmt/v1/license-users/${second}`);
    const disabled = await t.call("POST", `/mgmt/v1/licenses/${g.licenseId}/assignments`, {
      body: { user_id: second },
    });
    expect(disabled.status).toBe(422);
  });
});

describe("two-factor", () => {
  test("enrol shows the otpauth URI and ten recovery codes once; a right code turns it on; disable clears it", async () => {
    const user = (await createUser({ email: "ada@example.com" })).body.data.public_id;
    const enrol = await t.call("POST", `/mgmt/v1/license-users/${user}/two-factor/totp`);
    expect(enrol.status).toBe(201);
    expect(enrol.headers.get("cache-control")).toBe("no-store");
    const { otpauth_uri: uri, secret, recovery_codes: codes } = enrol.body.data;
    expect(uri).toStartWith("otpauth://totp/");
    expect(uri).toContain(`secret=${secret}`);
    expect(codes).toHaveLength(10);
    expect(new Set(codes).size).toBe(10);
    for (const code of codes) expect(code).toMatch(/^[0-9A-HJKMNP-TV-Z]{5}-[0-9A-HJKMNP-TV-Z]{5}$/);
    const shown = await t.call("GET", `/mgmt/v1/license-users/${user}`);
    expect(shown.text).not.toContain(secret);
    expect(shown.body.data.two_factor).toEqual({
      status: "pending",
      locked: false,
      recovery_codes_remaining: 10,
      passkeys: 0,
    });
    expect(readFileSync(join(t.dir, "licensing.db")).includes(secret)).toBe(false);

    const totp = new TOTP({ secret: Secret.fromBase32(secret) });
    const now = () => t.clock.now().getTime();
    const wrong = await t.call("POST", `/mgmt/v1/license-users/${user}/two-factor/totp/confirm`, {
      body: { code: totp.generate({ timestamp: now() - 600_000 }) },
    });
    expect(wrong.status).toBe(422);
    const right = await t.call("POST", `/mgmt/v1/license-users/${user}/two-factor/totp/confirm`, {
      body: { code: totp.generate({ timestamp: now() }) },
    });
    expect(right.status).toBe(200);
    expect(right.body.data.two_factor.status).toBe("enabled");
    const reenrol = await t.call("POST", `/mgmt/v1/license-users/${user}/two-factor/totp`);
    expect(reenrol.status).toBe(422);
    expect((await t.call("DELETE", `/mgmt/v1/license-users/${user}/two-factor`)).status).toBe(204);
    const off = await t.call("GET", `/mgmt/v1/license-users/${user}`);
    expect(off.body.data.two_factor).toEqual({
      status: "none",
      locked: false,
      recovery_codes_remaining: 0,
      passkeys: 0,
    });
    const again = await t.call("POST", `/mgmt/v1/license-users/${user}/two-factor/totp`);
    expect(again.body.data.secret).not.toBe(secret);
  });

  test("confirming without an enrolment is 422, and unlock without a lock changes nothing", async () => {
    const user = (await createUser({ email: "ada@example.com" })).body.data.public_id;
    const confirm = await t.call("POST", `/mgmt/v1/license-users/${user}/two-factor/totp/confirm`, {
      body: { code: "123456" },
    });
    expect(confirm.status).toBe(422);
    expect(confirm.body.error.code).toBe("INVALID_TRANSITION");
    const unlock = await t.call("POST", `/mgmt/v1/license-users/${user}/two-factor/unlock`);
    expect(unlock.status).toBe(200);
    expect(unlock.body.data.two_factor.locked).toBe(false);
  });
});
