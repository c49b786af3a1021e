import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { TestDevice } from "../support/device.ts";
import { expectSignedEnvelope, verifiedCertificate } from "../support/envelope.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { heartbeatPath, nowSec, proofCall } from "../support/runtime.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";
import {
  confirmTrial,
  freshEmail,
  signUp,
  startTrial,
  type TrialFixture,
  trialConfirmBody,
  trialFixture,
} from "../support/trials.ts";
import { seedWebhook } from "../support/webhooks.ts";

/**
 * Trial sign-up through the Runtime API (spec §3.2, §4.2 rules 9-11), reading each code from the
 * mail a real SMTP server received.
 */
let smtp: TestSmtpServer;
let t: TestContext;
let fx: TrialFixture;
let stopMail: () => Promise<void>;

beforeAll(async () => {
  smtp = await startSmtpServer();
});
afterAll(() => smtp.stop());
beforeEach(async () => {
  t = createTestContext();
  stopMail = deliverMail(t.deps, smtp.url);
  fx = await trialFixture(t, { policy: { max_machines: 2 } });
});
afterEach(async () => {
  await stopMail();
  t.close();
});

const DAY = 86_400;

describe("the whole flow", () => {
  test("start mails a code; confirm issues a trial license and a signed, device-bound activation", async () => {
    seedWebhook(t);
    const device = new TestDevice();
    const email = freshEmail();
    const started = await startTrial(t, fx.productId, email, device);
    expect(started.status).toBe(202);
    expectSignedEnvelope(started.body, {
      status: 202,
      nonce: started.body.response_assertion.nonce,
      productId: fx.productId,
      bundle: fx.bundle,
    });
    const expiresAt = new Date(t.clock.now().getTime() + 600_000).toISOString().slice(0, 16);
    expect(started.body.data).toMatchObject({ resend_after_sec: 120, code_length: 6 });
    expect(started.body.data.verification_id).toMatch(/^ver_[0-9A-Z]{26}$/);
    expect(started.body.data.expires_at.slice(0, 16)).toBe(expiresAt);

    const mail = await smtp.waitForMail(email);
    expect(mail.subject).toMatch(/^\d{6} is your Desk trial code$/);
    const code = mail.code as string;
    const body = trialConfirmBody(t, device, { code, email });
    const confirmed = await confirmTrial(t, started.body.data.verification_id, body);
    expect(confirmed.status).toBe(201);
    expectSignedEnvelope(confirmed.body, {
      status: 201,
      nonce: body.nonce as string,
      productId: fx.productId,
      bundle: fx.bundle,
    });
    const data = confirmed.body.data;
    expect(Object.keys(data).sort()).toEqual([
      "activation_id",
      "certificate",
      "license_id",
      "machine_info_digest",
    ]);
    const { claims } = verifiedCertificate(data.certificate, fx.bundle);
    expect(claims).toMatchObject({
      sub: data.license_id,
      aud: fx.productId,
      activation_id: data.activation_id,
      cnf: { jkt: device.thumbprint },
      license: { type: "trial", status: "active", policy_id: fx.trialPolicyId },
    });

    const license = await t.call("GET", `/mgmt/v1/licenses/${data.license_id}`);
    expect(license.body.data).toMatchObject({
      license_type: "trial",
      policy_id: fx.trialPolicyId,
      metadata: { trial_signup_email: email },
    });
    const trialEnd = t.clock.now().getTime() + 14 * DAY * 1000;
    expect(Math.abs(new Date(license.body.data.expires_at).getTime() - trialEnd)).toBeLessThan(5_000);
    // The license key never reaches the device.
    expect(confirmed.text).not.toContain(license.body.data.key);

    const events = await t.call("GET", "/mgmt/v1/events");
    const created = events.body.data.find((e: { type: string }) => e.type === "license.created");
    expect(created.actor).toEqual({ type: "device", id: device.thumbprint });
    expect(created.target.id).toBe(data.license_id);
    // The sign-up itself goes to webhook endpoints as trial.started (it has no audit entry).
    const queued = t.deps.sqlite
      .query<{ payload: string }, []>("SELECT payload FROM webhook_events WHERE type = 'trial.started'")
      .all()
      .map((row) => JSON.parse(row.payload));
    expect(queued).toHaveLength(1);
    expect(queued[0]).toMatchObject({
      type: "trial.started",
      environment: "live",
      data: {
        target: { type: "license", id: data.license_id },
        data: { product_id: fx.productId, activation_id: data.activation_id, policy_id: fx.trialPolicyId },
      },
    });
    expect(
      (await t.call("GET", `/mgmt/v1/products/${fx.productId}/trial-signup`)).body.data.started_last_24_hours,
    ).toBe(1);

    // The activation is an ordinary one: the device checks in with its proof.
    const heartbeat = await proofCall(
      t,
      device,
      "POST",
      heartbeatPath(data.activation_id),
      data.activation_id,
      {
        machine_info_digest: data.machine_info_digest,
      },
    );
    expect(heartbeat.status).toBe(200);
  });

  test("a signed-up trial converts to a full license with the same key", async () => {
    const { response } = await signUp(t, smtp, fx.productId, freshEmail(), new TestDevice("p256"));
    const licenseId = response.body.data.license_id;
    const before = await t.call("GET", `/mgmt/v1/licenses/${licenseId}`);
    const converted = await t.call("POST", `/mgmt/v1/licenses/${licenseId}/convert-trial`, {
      body: { target_policy_id: fx.fullPolicyId },
    });
    expect(converted.status).toBe(200);
    expect(converted.body.data).toMatchObject({
      license_type: "perpetual",
      policy_id: fx.fullPolicyId,
      key: before.body.data.key,
    });
  });

  test("a second device of the same address joins the active trial; a full license refuses MACHINE_LIMIT_REACHED", async () => {
    const email = freshEmail();
    const first = await signUp(t, smtp, fx.productId, email, new TestDevice());
    // Past the 120 s between two codes to one address; the address matches in any case.
    t.clock.advance(121);
    const second = await signUp(t, smtp, fx.productId, email.toUpperCase(), new TestDevice());
    expect(second.response.status).toBe(201);
    expect(second.response.body.data.license_id).toBe(first.response.body.data.license_id);
    expect(second.response.body.data.activation_id).not.toBe(first.response.body.data.activation_id);
    t.clock.advance(121);
    const third = await signUp(t, smtp, fx.productId, email, new TestDevice());
    expect(third.response.status).toBe(409);
    expect(third.response.body.error.code).toBe("MACHINE_LIMIT_REACHED");
    const licenses = await t.call("GET", `/mgmt/v1/licenses?product_id=${fx.productId}`);
    expect(licenses.body.data).toHaveLength(1);
  });
});

describe("quota accounting (rule 12)", () => {
  const runtimeUsed = async () =>
    (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas.runtime_requests.used as number;

  test("starts and failed confirms do not count; a trial confirm counts once, its replay not again", async () => {
    const before = await runtimeUsed();
    const device = new TestDevice();
    const email = freshEmail();
    const started = await startTrial(t, fx.productId, email, device);
    await startTrial(t, fx.productId, email, device);
    const code = await smtp.waitForCode(email);
    const wrongCode = String((Number(code) + 1) % 1_000_000).padStart(6, "0");
    const id = started.body.data.verification_id;
    await confirmTrial(t, id, trialConfirmBody(t, device, { code: wrongCode, email }));
    expect(await runtimeUsed()).toBe(before);
    const key = "trial-confirm-quota-key-1";
    expect((await confirmTrial(t, id, trialConfirmBody(t, device, { code, email }), key)).status).toBe(201);
    expect(await runtimeUsed()).toBe(before + 1);
    const replay = await confirmTrial(t, id, trialConfirmBody(t, device, { code, email }), key);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(await runtimeUsed()).toBe(before + 1);
  });
});

describe("confirm refusals", () => {
  async function started(device = new TestDevice(), email = freshEmail()) {
    const response = await startTrial(t, fx.productId, email, device);
    const code = await smtp.waitForCode(email);
    return { id: response.body.data.verification_id as string, code, email, device };
  }

  const wrong = (code: string) => String((Number(code) + 1) % 1_000_000).padStart(6, "0");

  test("each wrong code costs an attempt; after five, even the right code is 410", async () => {
    const v = await started();
    for (const remaining of [4, 3, 2, 1, 0]) {
      const response = await confirmTrial(
        t,
        v.id,
        trialConfirmBody(t, v.device, { code: wrong(v.code), email: v.email }),
      );
      expect(response.status).toBe(401);
      expect(response.body.error).toMatchObject({
        code: "EMAIL_VERIFICATION_CODE_INVALID",
        details: { remaining_attempts: remaining },
      });
    }
    const right = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: v.code, email: v.email }),
    );
    expect(right.status).toBe(410);
    expect(right.body.error.code).toBe("EMAIL_VERIFICATION_EXPIRED");
    expect((await t.call("GET", "/mgmt/v1/licenses")).body.data).toHaveLength(0);
  });

  test("the right code with another address is refused like a wrong code", async () => {
    const v = await started();
    const response = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: v.code, email: "someone-else@example.com" }),
    );
    expect(response.status).toBe(401);
    expect(response.body.error.details.remaining_attempts).toBe(4);
  });

  test("a code is good for 10 minutes", async () => {
    const v = await started();
    t.clock.advance(601);
    const response = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: v.code, email: v.email }),
    );
    expect(response.status).toBe(410);
    expect(response.body.error.code).toBe("EMAIL_VERIFICATION_EXPIRED");
  });

  test("an unknown verification is 410 and a used one is 410 under a new Idempotency-Key", async () => {
    const unknown = await confirmTrial(
      t,
      "ver_01JZ8X4M6Q2T9V3B7N5K1R0W8Y",
      trialConfirmBody(t, new TestDevice(), { code: "123456", email: freshEmail() }),
    );
    expect(unknown.status).toBe(410);
    const v = await started();
    expect(
      (await confirmTrial(t, v.id, trialConfirmBody(t, v.device, { code: v.code, email: v.email }))).status,
    ).toBe(201);
    const reused = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: v.code, email: v.email }),
    );
    expect(reused.status).toBe(410);
  });

  test("the same Idempotency-Key and body replays the 201, re-signed for the new nonce; another body is 409", async () => {
    const v = await started();
    const key = "trial-confirm-replay-key-1";
    const first = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: v.code, email: v.email }),
      key,
    );
    expect(first.status).toBe(201);
    const retryBody = trialConfirmBody(t, v.device, { code: v.code, email: v.email });
    const replay = await confirmTrial(t, v.id, retryBody, key);
    expect(replay.status).toBe(201);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.body.data).toEqual(first.body.data);
    expectSignedEnvelope(replay.body, {
      status: 201,
      nonce: retryBody.nonce as string,
      productId: fx.productId,
      bundle: fx.bundle,
    });
    const other = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: v.code, email: v.email, extra: { app_version: "2.0.0" } }),
      key,
    );
    expect(other.status).toBe(409);
    expect(other.body.error.code).toBe("IDEMPOTENCY_CONFLICT");
    expect((await t.call("GET", "/mgmt/v1/licenses")).body.data).toHaveLength(1);
  });

  test("a replay after the trial license was revoked gets the signed LICENSE_REVOKED naming the device key and the license, not the 201", async () => {
    const v = await started();
    const key = "trial-confirm-replay-key-2";
    const first = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: v.code, email: v.email }),
      key,
    );
    await t.call("DELETE", `/mgmt/v1/licenses/${first.body.data.license_id}`);
    const retryBody = trialConfirmBody(t, v.device, { code: v.code, email: v.email });
    const replay = await confirmTrial(t, v.id, retryBody, key);
    expect(replay.status).toBe(403);
    expect(replay.body.error.code).toBe("LICENSE_REVOKED");
    // Before the device holds an activation a signed denial names its key (protocol §16), and
    // the signature covers that subject with the rest of the error.
    expect(replay.body.error.details).toMatchObject({
      device_thumbprint: v.device.thumbprint,
      license_id: first.body.data.license_id,
    });
    expectSignedEnvelope(replay.body, {
      status: 403,
      nonce: retryBody.nonce as string,
      productId: fx.productId,
      bundle: fx.bundle,
    });
  });

  test("without an Idempotency-Key the confirm is 400 and costs no attempt", async () => {
    const v = await started();
    const response = await t.call("POST", `/runtime/v1/trial-verifications/${v.id}/confirm`, {
      key: null,
      body: trialConfirmBody(t, v.device, { code: wrong(v.code), email: v.email }),
    });
    expect(response.status).toBe(400);
    const next = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: wrong(v.code), email: v.email }),
    );
    expect(next.body.error.details.remaining_attempts).toBe(4);
  });

  test("a proof with the activation prefix, a forged proof or a tampered body is 401 DEVICE_PROOF_INVALID and costs no attempt", async () => {
    const v = await started();
    const activationPrefixed = trialConfirmBody(t, v.device, {
      code: v.code,
      email: v.email,
      prefix: "Service-Activation-Proof-v1\n",
    });
    const forged = trialConfirmBody(t, new TestDevice(), { code: v.code, email: v.email });
    forged.device_signing_public_key = v.device.signingPublic;
    const tampered = trialConfirmBody(t, v.device, { code: v.code, email: v.email });
    tampered.machine_info = { os: "windows", arch: "x64" };
    for (const body of [activationPrefixed, forged, tampered]) {
      const response = await confirmTrial(t, v.id, body);
      expect(response.status).toBe(401);
      expect(response.body.error).toMatchObject({
        code: "DEVICE_PROOF_INVALID",
        details: { reason: "invalid_signature" },
      });
    }
    const ok = await confirmTrial(t, v.id, trialConfirmBody(t, v.device, { code: v.code, email: v.email }));
    expect(ok.status).toBe(201);
  });

  test("a captured confirm sent again under a new Idempotency-Key does not issue twice", async () => {
    const v = await started();
    const body = trialConfirmBody(t, v.device, { code: v.code, email: v.email });
    expect((await confirmTrial(t, v.id, body)).status).toBe(201);
    const again = await confirmTrial(t, v.id, body);
    expect(again.status).toBe(410);
  });

  test("a confirm from another device key than the start is 409 DEVICE_KEY_MISMATCH", async () => {
    const v = await started();
    const response = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, new TestDevice(), { code: v.code, email: v.email }),
    );
    expect(response.status).toBe(409);
    expect(response.body.error.code).toBe("DEVICE_KEY_MISMATCH");
    expect((await t.call("GET", "/mgmt/v1/licenses")).body.data).toHaveLength(0);
  });

  test("a device rejoining its running trial with another KEM key is 409 DEVICE_KEY_MISMATCH, and its verification stays unused", async () => {
    const device = new TestDevice();
    const email = freshEmail();
    const first = await signUp(t, smtp, fx.productId, email, device);
    const activationId = first.response.body.data.activation_id;
    t.clock.advance(121);
    const v = await started(device, email);
    const body = () =>
      trialConfirmBody(t, device, {
        code: v.code,
        email,
        extra: { device_kem_public_key: new TestDevice().kemPublic },
      });
    const refused = await confirmTrial(t, v.id, body(), "trial-confirm-kem-mismatch");
    expect(refused.status).toBe(409);
    expect(refused.body.error).toMatchObject({
      code: "DEVICE_KEY_MISMATCH",
      details: { activation_id: activationId },
    });
    expect(refused.body.response_signature).toBeUndefined();
    const kem = t.deps.sqlite
      .query<{ k: string }, [string]>("SELECT device_kem_key AS k FROM activations WHERE id = ?")
      .get(activationId)?.k;
    expect(kem).toBe(device.kemPublic);
    // The refusal rolled back: the same code still confirms with the device's own keys.
    const again = await confirmTrial(t, v.id, trialConfirmBody(t, device, { code: v.code, email }));
    expect(again.status).toBe(201);
    expect(again.body.data.activation_id).toBe(activationId);
  });

  test("a machine_signals name over 64 characters is 422 keyed at machine_signals and costs no attempt", async () => {
    const v = await started();
    const refused = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, {
        code: v.code,
        email: v.email,
        extra: { machine_signals: { ["n".repeat(65)]: "v" } },
      }),
    );
    expect(refused.status).toBe(422);
    expect(refused.body.error.details.errors).toEqual({
      machine_signals: ["member names are 1-64 characters"],
    });
    const attempts = t.deps.sqlite
      .query<{ attempts: number }, [string]>("SELECT attempts FROM trial_verifications WHERE id = ?")
      .get(v.id)?.attempts;
    expect(attempts).toBe(0);
    const ok = await confirmTrial(t, v.id, trialConfirmBody(t, v.device, { code: v.code, email: v.email }));
    expect(ok.status).toBe(201);
  });

  test("a device clock more than 300 s off is 401 CLOCK_SKEW", async () => {
    const v = await started();
    t.clock.freeze();
    const response = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, {
        code: v.code,
        email: v.email,
        extra: { client_time: nowSec(t) - 301 },
      }),
    );
    expect(response.status).toBe(401);
    expect(response.body.error).toMatchObject({ code: "CLOCK_SKEW", details: { server_time: nowSec(t) } });
  });

  test("a KEM key that is not P-256 is 422", async () => {
    const v = await started();
    const response = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, {
        code: v.code,
        email: v.email,
        extra: { device_kem_public_key: v.device.signingPublic },
      }),
    );
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.device_kem_public_key).toBeDefined();
  });

  test("a plan that lost trial_licenses after the start refuses with 403 PLAN_ENTITLEMENT_REQUIRED", async () => {
    const v = await started();
    t.workspace.setPlan("personal");
    const response = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: v.code, email: v.email }),
    );
    expect(response.status).toBe(403);
    expect(response.body.error).toMatchObject({
      code: "PLAN_ENTITLEMENT_REQUIRED",
      details: { entitlement: "trial_licenses" },
    });
  });

  test("sign-ups stopped after the start refuse with 403 TRIAL_ACTIVATION_INVALID", async () => {
    const v = await started();
    await t.call("PATCH", `/mgmt/v1/products/${fx.productId}/trial-signup`, { body: { policy_id: null } });
    const response = await confirmTrial(
      t,
      v.id,
      trialConfirmBody(t, v.device, { code: v.code, email: v.email }),
    );
    expect(response.status).toBe(403);
    expect(response.body.error).toMatchObject({
      code: "TRIAL_ACTIVATION_INVALID",
      details: { reason: "disabled" },
    });
  });
});
