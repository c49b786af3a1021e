import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { LicensingClient, MemoryStorage, SdkError, trialProofMessage } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";
import { freshEmail, type TrialFixture, trialFixture } from "../support/trials.ts";

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
