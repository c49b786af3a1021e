import { canonicalize } from "../../src/crypto/jcs.ts";
import { mailPayloadContext } from "../../src/mail/outbox.ts";
import { freshNonce, type TestDevice } from "./device.ts";
import type { TrustBundleBody } from "./envelope.ts";
import type { CallResult, TestContext } from "./harness.ts";
import { nowSec } from "./runtime.ts";
import type { TestSmtpServer } from "./smtp.ts";

export interface TrialFixture {
  productId: string;
  trialPolicyId: string;
  fullPolicyId: string;
  bundle: TrustBundleBody;
  key: string;
}

/** A product with a trial policy chosen for sign-ups and a full policy to convert to, made through the Management API. */
export async function trialFixture(
  t: TestContext,
  options: {
    policy?: Record<string, unknown>;
    signup?: Record<string, unknown>;
    environment?: "live" | "test";
  } = {},
): Promise<TrialFixture> {
  const environment = options.environment ?? "live";
  const key = environment === "live" ? t.keys.live : t.keys.test;
  const product = await t.call("POST", "/mgmt/v1/products", {
    key,
    body: { name: "Desk", code: `desk-${Math.random().toString(36).slice(2, 10)}`, environment },
    headers: t.idem(),
  });
  const productId = product.body.data.public_id as string;
  const trial = await t.call("POST", "/mgmt/v1/policies", {
    key,
    body: { product_id: productId, name: "Trial", license_type: "trial", trial_days: 14, ...options.policy },
    headers: t.idem(),
  });
  if (trial.status !== 201) throw new Error(`trial policy: ${trial.text}`);
  const full = await t.call("POST", "/mgmt/v1/policies", {
    key,
    body: { product_id: productId, name: "Full" },
    headers: t.idem(),
  });
  const signup = await t.call("PATCH", `/mgmt/v1/products/${productId}/trial-signup`, {
    key,
    body: { policy_id: trial.body.data.public_id, ...options.signup },
  });
  if (signup.status !== 200) throw new Error(`trial signup: ${signup.text}`);
  const bundle = await t.call("GET", `/runtime/v1/products/${productId}/trust-bundle`, { key: null });
  return {
    productId,
    trialPolicyId: trial.body.data.public_id,
    fullPolicyId: full.body.data.public_id,
    bundle: bundle.body.data.bundle,
    key,
  };
}

export function startTrial(
  t: TestContext,
  productId: string,
  email: string,
  device: TestDevice,
  extra: Record<string, unknown> = {},
): Promise<CallResult> {
  return t.call("POST", "/runtime/v1/trial-verifications", {
    key: null,
    body: {
      product_id: productId,
      email,
      device_signing_public_key: device.signingPublic,
      nonce: freshNonce(),
      locale: "en",
      sdk_version: "test",
      ...extra,
    },
  });
}

/** A confirm body signed as docs/protocol.md says: the trial prefix over JCS(body without device_proof). */
export function trialConfirmBody(
  t: TestContext,
  device: TestDevice,
  input: { code: string; email: string; extra?: Record<string, unknown>; prefix?: string },
): Record<string, unknown> {
  const body: Record<string, unknown> = {
    code: input.code,
    email: input.email,
    device_signing_public_key: device.signingPublic,
    device_kem_public_key: device.kemPublic,
    machine_info: { os: "linux", arch: "x64" },
    machine_signals: { hostname: "trial-host" },
    app_version: "1.0.0",
    sdk_version: "test",
    client_time: nowSec(t),
    nonce: freshNonce(),
    ...input.extra,
  };
  body.device_proof = device.sign(`${input.prefix ?? "Service-Trial-Proof-v1\n"}${canonicalize(body)}`);
  return body;
}

export function confirmTrial(
  t: TestContext,
  verificationId: string,
  body: Record<string, unknown>,
  idempotencyKey = `trial-confirm-${Math.random().toString(36).slice(2)}`,
): Promise<CallResult> {
  return t.call("POST", `/runtime/v1/trial-verifications/${verificationId}/confirm`, {
    key: null,
    body,
    headers: { "idempotency-key": idempotencyKey },
  });
}

/** Start, read the code from the delivered mail, confirm: the whole sign-up. */
export async function signUp(
  t: TestContext,
  smtp: TestSmtpServer,
  productId: string,
  email: string,
  device: TestDevice,
): Promise<{ verificationId: string; code: string; response: CallResult }> {
  const started = await startTrial(t, productId, email, device);
  if (started.status !== 202) throw new Error(`start: ${started.text}`);
  const verificationId = started.body.data.verification_id as string;
  const code = await smtp.waitForCode(email);
  const response = await confirmTrial(t, verificationId, trialConfirmBody(t, device, { code, email }));
  return { verificationId, code, response };
}

/**
 * The code a silent start generated and never mailed, read from its suppressed outbox row: what an
 * attacker would guess at, so tests can show it confirms nothing.
 */
export function unsentCode(t: TestContext, email: string): string {
  const row = t.deps.sqlite
    .query<{ id: string; payload: string }, [string]>(
      "SELECT id, payload FROM mail_outbox WHERE recipient = ? AND status = 'suppressed' ORDER BY id DESC LIMIT 1",
    )
    .get(email);
  if (!row) throw new Error(`no suppressed mail to ${email}`);
  const data = JSON.parse(t.deps.secrets.decrypt(row.payload, mailPayloadContext(row.id)));
  return (data as { code: string }).code;
}

/** Rows the outbox holds for an address: what was (or will be) sent to it; a silent start's suppressed row is not mail. */
export const mailsTo = (t: TestContext, email: string): number =>
  t.deps.sqlite
    .query<{ n: number }, [string]>(
      "SELECT count(*) AS n FROM mail_outbox WHERE recipient = ? AND status != 'suppressed'",
    )
    .get(email)?.n ?? 0;

let counter = 0;
/** A fresh address per use: the SMTP server is shared by the tests of a file. */
export const freshEmail = (label = "user") => `${label}-${Date.now().toString(36)}-${++counter}@example.com`;
