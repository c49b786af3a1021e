import { expect } from "bun:test";
import { Secret, TOTP } from "otpauth";
import { licenseAssignments, licenseUsers } from "../../src/store/schema/index.ts";
import { freshNonce, type TestDevice } from "./device.ts";
import type { CallResult, TestContext } from "./harness.ts";
import { type RuntimeFixture, runtimeFixture } from "./runtime.ts";
import type { TestSmtpServer } from "./smtp.ts";

export interface NamedUserFixture extends RuntimeFixture {
  userId: string;
  assignmentId: string;
  email: string;
}

/** A named-user product, policy and license, with one user assigned to the license (live, unless `key` is another). */
export async function namedUserFixture(
  t: TestContext,
  options: { email?: string; policy?: Record<string, unknown>; key?: string } = {},
): Promise<NamedUserFixture> {
  const { key } = options;
  const fixture = await runtimeFixture(t, {
    policy: { identity_mode: "named_user", ...options.policy },
    key,
  });
  const email = options.email ?? `ada.${Math.random().toString(36).slice(2, 8)}@example.com`;
  const user = await t.call("POST", "/mgmt/v1/license-users", { key, body: { email, name: "Ada" } });
  if (user.status !== 201) throw new Error(`user: ${user.text}`);
  const assignment = await t.call("POST", `/mgmt/v1/licenses/${fixture.licenseId}/assignments`, {
    key,
    body: { user_id: user.body.data.public_id },
  });
  if (assignment.status !== 201) throw new Error(`assignment: ${assignment.text}`);
  return {
    ...fixture,
    email,
    userId: user.body.data.public_id,
    assignmentId: assignment.body.data.public_id,
  };
}

/**
 * Another license of the fixture's product and policy, with `userId` assigned to it if given: for
 * a user on two licenses, or a license key the user is not on.
 */
export async function otherLicense(
  t: TestContext,
  fixture: Pick<RuntimeFixture, "productId" | "policyId">,
  userId?: string,
): Promise<Pick<RuntimeFixture, "productId" | "licenseId" | "licenseKey">> {
  const license = await t.call("POST", "/mgmt/v1/licenses", {
    body: { product_id: fixture.productId, policy_id: fixture.policyId },
    headers: t.idem(),
  });
  if (license.status !== 201) throw new Error(`license: ${license.text}`);
  if (userId) {
    const assigned = await t.call("POST", `/mgmt/v1/licenses/${license.body.data.public_id}/assignments`, {
      body: { user_id: userId },
    });
    if (assigned.status !== 201) throw new Error(`assignment: ${assigned.text}`);
  }
  return {
    productId: fixture.productId,
    licenseId: license.body.data.public_id,
    licenseKey: license.body.data.key,
  };
}

/**
 * A verification start whose code is read from the delivered mail, past the 120 s the send limits
 * keep between codes to an address (so tests can start one after another).
 */
export async function startedWithMailedCode(
  t: TestContext,
  smtp: Pick<TestSmtpServer, "waitForCode">,
  fixture: Pick<RuntimeFixture, "productId" | "licenseKey">,
  email: string,
  device: TestDevice,
) {
  t.clock.advance(121);
  const response = await startVerification(t, device, fixture, email);
  expect(response.status).toBe(202);
  const code = await smtp.waitForCode(email);
  return { id: response.body.data.verification_id as string, code, response };
}

export function startVerification(
  t: TestContext,
  device: TestDevice,
  fixture: Pick<RuntimeFixture, "productId" | "licenseKey">,
  email: string,
  extra: Record<string, unknown> = {},
): Promise<CallResult> {
  return t.call("POST", "/runtime/v1/email-verifications", {
    key: null,
    body: {
      product_id: fixture.productId,
      license_key: fixture.licenseKey,
      email,
      device_signing_public_key: device.signingPublic,
      nonce: freshNonce(),
      locale: "en",
      sdk_version: "test",
      ...extra,
    },
  });
}

export function confirmVerification(
  t: TestContext,
  device: TestDevice,
  verificationId: string,
  code: string,
  extra: Record<string, unknown> = {},
): Promise<CallResult> {
  return t.call("POST", `/runtime/v1/email-verifications/${verificationId}/confirm`, {
    key: null,
    body: {
      code,
      device_signing_public_key: device.signingPublic,
      nonce: freshNonce(),
      sdk_version: "test",
      ...extra,
    },
  });
}

/** Enrols and confirms TOTP for a user; returns a code generator on the test clock and the recovery codes. */
export async function enableTotp(t: TestContext, userId: string) {
  const enrolment = await t.call("POST", `/mgmt/v1/license-users/${userId}/two-factor/totp`);
  if (enrolment.status !== 201) throw new Error(`enrol: ${enrolment.text}`);
  const secret = Secret.fromBase32(enrolment.body.data.secret);
  const totp = new TOTP({ secret, digits: 6, period: 30, algorithm: "SHA1" });
  const codeAt = (offsetSec = 0) => totp.generate({ timestamp: t.clock.now().getTime() + offsetSec * 1000 });
  const confirmed = await t.call("POST", `/mgmt/v1/license-users/${userId}/two-factor/totp/confirm`, {
    body: { code: codeAt() },
  });
  if (confirmed.status !== 200) throw new Error(`confirm: ${confirmed.text}`);
  // The confirmation spent the current step; move to the next one so the first login can use a code.
  t.clock.advance(30);
  return {
    codeAt,
    recoveryCodes: enrolment.body.data.recovery_codes as string[],
    uri: enrolment.body.data.otpauth_uri as string,
  };
}

/** A license user and an assignment written straight into the store, for the shared management suite. */
export function seedNamedUser(t: TestContext, environment: "live" | "test", licenseId: string) {
  const now = t.clock.now();
  const userId = t.deps.ids.next("user", now.getTime());
  const assignmentId = t.deps.ids.next("assignment", now.getTime());
  t.deps.db
    .insert(licenseUsers)
    .values({
      id: userId,
      environment,
      email: `${userId.toLowerCase()}@example.com`,
      emailNormalized: `${userId.toLowerCase()}@example.com`,
      status: "active",
      totpStatus: "none",
      createdAt: now,
      updatedAt: now,
    })
    .run();
  t.deps.db
    .insert(licenseAssignments)
    .values({ id: assignmentId, environment, licenseId, userId, status: "active", createdAt: now })
    .run();
  return { userId, assignmentId };
}
