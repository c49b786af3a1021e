import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import {
  exportDeviceKeys,
  generateDeviceKeys,
  LicensingClient,
  MemoryStorage,
  SdkError,
  thumbprint,
  trialProofMessage,
} from "../../src/sdk/index.ts";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";
import {
  confirmTrial as confirmTrialRoute,
  freshEmail,
  startTrial as startTrialRoute,
  type TrialFixture,
  trialConfirmBody,
  trialFixture,
} from "../support/trials.ts";

/**
 * startTrial/confirmTrial of the SDK against the real server in-process, with the code read from
 * the mail a real SMTP server received.
 */
let smtp: TestSmtpServer;
let t: TestContext;
let fx: TrialFixture;
let stopMail: () => Promise<void>;
// biome-ignore lint/suspicious/noExplicitAny: the integration config is JSON from the API.
let config: any;
const requests: { path: string; body: Record<string, unknown> }[] = [];

beforeAll(async () => {
  smtp = await startSmtpServer();
});
afterAll(() => smtp.stop());
beforeEach(async () => {
  t = createTestContext();
  stopMail = deliverMail(t.deps, smtp.url);
  fx = await trialFixture(t, { policy: { max_machines: 2 } });
  config = (await t.call("GET", `/mgmt/v1/products/${fx.productId}/integration-config`)).body.data.config;
  requests.length = 0;
});
afterEach(async () => {
  await stopMail();
  t.close();
});

async function inProcessFetch(url: string, init?: RequestInit): Promise<Response> {
  const request = new Request(url, init);
  const text = await request.clone().text();
  requests.push({ path: new URL(url).pathname, body: text ? JSON.parse(text) : {} });
  return t.app.handle(request);
}

const client = (alg: "ed25519" | "p256" = "ed25519", storage = new MemoryStorage()) =>
  new LicensingClient({
    config,
    fetch: inProcessFetch as never,
    storage,
    now: () => t.clock.now().getTime(),
    signingAlgorithm: alg,
    appVersion: "2.0.0",
  });

const machineInfo = { os: "linux", arch: "x64" };

async function sdkError(promise: Promise<unknown>): Promise<SdkError> {
  try {
    await promise;
  } catch (error) {
    if (error instanceof SdkError) return error;
    throw error;
  }
  throw new Error("expected the SDK to refuse");
}

describe.each(["ed25519", "p256"] as const)("with %s device keys", (alg) => {
  test("startTrial, the mailed code, confirmTrial: the device is activated on a trial license", async () => {
    const device = client(alg);
    const email = freshEmail();
    const started = await device.startTrial({ email, locale: "en" });
    expect(started).toMatchObject({ resendAfterSec: 120, codeLength: 6 });
    expect(started.verificationId).toMatch(/^ver_/);
    const code = await smtp.waitForCode(email);
    const result = await device.confirmTrial({
      verificationId: started.verificationId,
      code,
      email,
      machineInfo,
    });
    expect(result.activationId).toMatch(/^act_/);
    expect(result.certificate.license.type).toBe("trial");
    expect(await device.activationId()).toBe(result.activationId);
    expect(await device.licenseState()).toBe("valid");
    const heartbeat = await device.heartbeat();
    expect(heartbeat.licenseStatus).toBe("active");

    const confirm = requests.find((r) => r.path.endsWith("/confirm"));
    const { device_proof: _proof, ...signed } = confirm?.body ?? {};
    expect(trialProofMessage(signed).startsWith("Service-Trial-Proof-v1\n{")).toBe(true);
    const license = await t.call("GET", `/mgmt/v1/licenses/${result.licenseId}`);
    expect(license.body.data.license_type).toBe("trial");
  });
});

describe("refusals", () => {
  test("a wrong code is a server error with remaining_attempts, and the device stays unactivated", async () => {
    const device = client();
    const email = freshEmail();
    const started = await device.startTrial({ email });
    const code = await smtp.waitForCode(email);
    const wrong = String((Number(code) + 1) % 1_000_000).padStart(6, "0");
    const error = await sdkError(
      device.confirmTrial({ verificationId: started.verificationId, code: wrong, email, machineInfo }),
    );
    expect(error).toMatchObject({ kind: "server", code: "EMAIL_VERIFICATION_CODE_INVALID", status: 401 });
    expect(error.details.remaining_attempts).toBe(4);
    expect(await device.activationId()).toBeUndefined();
    await device.confirmTrial({ verificationId: started.verificationId, code, email, machineInfo });
    expect(await device.activationId()).toBeDefined();
  });

  test("an activated device cannot confirm a trial, and bad arguments are refused before any request", async () => {
    const device = client();
    expect((await sdkError(device.startTrial({ email: "not an address" }))).code).toBe("INVALID_ARGUMENT");
    expect(requests).toHaveLength(0);
    const email = freshEmail();
    const started = await device.startTrial({ email });
    const code = await smtp.waitForCode(email);
    await device.confirmTrial({ verificationId: started.verificationId, code, email, machineInfo });
    const again = await sdkError(
      device.confirmTrial({ verificationId: started.verificationId, code, email, machineInfo }),
    );
    expect(again.code).toBe("ALREADY_ACTIVATED");
  });

  test("a signed LICENSE_REVOKED naming another device's key, signed for this device's nonce, is refused and changes nothing", async () => {
    // Another device signed up and its trial license was revoked: a replay of its confirm (same
    // Idempotency-Key) now gets the server's signed LICENSE_REVOKED naming that device's key.
    const other = new TestDevice();
    const otherEmail = freshEmail("other");
    const otherStart = await startTrialRoute(t, fx.productId, otherEmail, other);
    const otherId = otherStart.body.data.verification_id as string;
    const otherCode = await smtp.waitForCode(otherEmail);
    const otherKey = "trial-confirm-other-device";
    const otherConfirm = (nonce?: string) =>
      trialConfirmBody(t, other, {
        code: otherCode,
        email: otherEmail,
        ...(nonce === undefined ? {} : { extra: { nonce } }),
      });
    const first = await confirmTrialRoute(t, otherId, otherConfirm(), otherKey);
    expect(first.status).toBe(201);
    await t.call("DELETE", `/mgmt/v1/licenses/${first.body.data.license_id}`);

    // Whoever sits between this device and the server answers its confirm with that replay, made
    // with this device's nonce so that the server signs the denial for it.
    let relay = true;
    const relayed: { status: number; error?: Record<string, unknown> }[] = [];
    const device = new LicensingClient({
      config,
      fetch: (async (url: string, init?: RequestInit) => {
        if (!relay || !url.endsWith("/confirm")) return inProcessFetch(url, init);
        const { nonce } = JSON.parse(String(init?.body)) as { nonce: string };
        const response = await t.app.handle(
          new Request(new URL(`/runtime/v1/trial-verifications/${otherId}/confirm`, url).href, {
            method: "POST",
            headers: { "content-type": "application/json", "idempotency-key": otherKey },
            body: JSON.stringify(otherConfirm(nonce)),
          }),
        );
        const body = (await response.clone().json()) as { error?: Record<string, unknown> };
        relayed.push({ status: response.status, ...(body.error ? { error: body.error } : {}) });
        return response;
      }) as never,
      now: () => t.clock.now().getTime(),
      appVersion: "2.0.0",
    });
    const email = freshEmail();
    const started = await device.startTrial({ email });
    const code = await smtp.waitForCode(email);
    const error = await sdkError(
      device.confirmTrial({ verificationId: started.verificationId, code, email, machineInfo }),
    );
    // The relayed answer is the server's own signed denial for the other device's key ...
    expect(relayed).toHaveLength(1);
    expect(relayed[0]).toMatchObject({
      status: 403,
      error: { code: "LICENSE_REVOKED", details: { device_thumbprint: other.thumbprint } },
    });
    // ... which verifies (nonce, signature) and is refused only for whom it names.
    const keys = await device.deviceKeys();
    expect(thumbprint(keys.signing.publicKey)).not.toBe(other.thumbprint);
    expect(error).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification", authentic: false });
    expect(error.details).toMatchObject({
      server_code: "LICENSE_REVOKED",
      field: "device_thumbprint",
      received: other.thumbprint,
    });
    expect(await device.activationId()).toBeUndefined();
    expect(await device.licenseInfo()).toMatchObject({ state: "invalid", reason: "not_activated" });

    // This device's own trial is untouched: its code still confirms it.
    relay = false;
    const own = await device.confirmTrial({
      verificationId: started.verificationId,
      code,
      email,
      machineInfo,
    });
    expect(own.certificate.license.type).toBe("trial");
    expect(await device.licenseState()).toBe("valid");
  });

  test("keys replaced by another client while a confirm is in flight refuse it as not retryable, with no second confirm; a new start with the stored keys joins the trial made", async () => {
    const storage = new MemoryStorage();
    const prefix = `svc.v1.live.${fx.productId}.`;
    let replaceKeys = true;
    const device = new LicensingClient({
      config,
      fetch: (async (url: string, init?: RequestInit) => {
        const response = await inProcessFetch(url, init);
        if (replaceKeys && url.endsWith("/confirm"))
          await storage.set(`${prefix}device_keys`, exportDeviceKeys(generateDeviceKeys()));
        return response;
      }) as never,
      storage,
      now: () => t.clock.now().getTime(),
      appVersion: "2.0.0",
    });
    const email = freshEmail();
    const started = await device.startTrial({ email });
    const code = await smtp.waitForCode(email);
    const error = await sdkError(
      device.confirmTrial({ verificationId: started.verificationId, code, email, machineInfo }),
    );
    // The code is spent and the verification names the replaced keys: asking again cannot help.
    expect(error).toMatchObject({ kind: "storage", code: "DEVICE_KEYS_CHANGED", retryable: false });
    expect(requests.filter((r) => r.path.endsWith("/confirm"))).toHaveLength(1);
    const orphan = (await t.call("GET", `/mgmt/v1/activations/${error.details.activation_id}`)).body.data;
    expect(orphan.status).toBe("deactivated");
    expect(await device.activationId()).toBeUndefined();

    replaceKeys = false;
    t.clock.advance(121);
    const again = await device.startTrial({ email });
    const joined = await device.confirmTrial({
      verificationId: again.verificationId,
      code: await smtp.waitForCode(email),
      email,
      machineInfo,
    });
    expect(joined.licenseId).toBe(orphan.license_id);
    expect(await device.licenseState()).toBe("valid");
  });

  test("a confirm answer tampered in transit is refused by the signature check", async () => {
    const email = freshEmail();
    const device = new LicensingClient({
      config,
      fetch: (async (url: string, init?: RequestInit) => {
        const response = await inProcessFetch(url, init);
        if (!url.endsWith("/confirm")) return response;
        const body = (await response.json()) as { data: Record<string, unknown> };
        body.data.license_id = "lic_01JZ8X4M6Q2T9V3B7N5K1R0W8Y";
        return new Response(JSON.stringify(body), { status: response.status, headers: response.headers });
      }) as never,
      now: () => t.clock.now().getTime(),
      appVersion: "2.0.0",
    });
    const started = await device.startTrial({ email });
    const code = await smtp.waitForCode(email);
    const error = await sdkError(
      device.confirmTrial({ verificationId: started.verificationId, code, email, machineInfo }),
    );
    expect(error.kind).toBe("verification");
    expect(await device.activationId()).toBeUndefined();
  });
});
