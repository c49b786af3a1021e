import { afterAll, afterEach, beforeAll, beforeEach, expect, test } from "bun:test";
import { LicensingClient, MemoryStorage, SdkError } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { enableTotp, type NamedUserFixture, namedUserFixture } from "../support/named-users.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";

/**
 * startEmailVerification/confirmEmailVerification of the SDK against the real server in-process,
 * with the code read from the mail a real SMTP server received, then activate() with the token.
 */
let smtp: TestSmtpServer;
let t: TestContext;
let f: NamedUserFixture;
let stopMail: () => Promise<void>;
// biome-ignore lint/suspicious/noExplicitAny: the integration config is JSON from the API.
let config: any;

beforeAll(async () => {
  smtp = await startSmtpServer();
});
afterAll(() => smtp.stop());
beforeEach(async () => {
  t = createTestContext();
  stopMail = deliverMail(t.deps, smtp.url);
  f = await namedUserFixture(t);
  config = (await t.call("GET", `/mgmt/v1/products/${f.productId}/integration-config`)).body.data.config;
});
afterEach(async () => {
  await stopMail();
  t.close();
});

const client = (alg: "ed25519" | "p256" = "ed25519") =>
  new LicensingClient({
    config,
    fetch: ((url: string, init?: RequestInit) => t.app.handle(new Request(url, init))) as never,
    storage: new MemoryStorage(),
    now: () => t.clock.now().getTime(),
    signingAlgorithm: alg,
  });

async function sdkError(promise: Promise<unknown>): Promise<SdkError> {
  try {
    await promise;
  } catch (error) {
    if (error instanceof SdkError) return error;
    throw error;
  }
  throw new Error("expected the SDK to refuse");
}

test.each(["ed25519", "p256"] as const)(
  "with %s keys: start, the mailed code, confirm, activate with the token",
  async (alg) => {
    const app = client(alg);
    const started = await app.startEmailVerification({
      licenseKey: f.licenseKey,
      email: f.email,
      locale: "en",
    });
    expect(started).toMatchObject({ resendAfterSec: 120, codeLength: 6 });
    const code = await smtp.waitForCode(f.email);
    const token = await app.confirmEmailVerification({ verificationId: started.verificationId, code });
    expect(token.namedUserToken).toStartWith("nut_");
    const activation = await app.activate({
      licenseKey: f.licenseKey,
      machineInfo: { os: "linux", arch: "x64" },
      namedUserToken: token.namedUserToken,
    });
    expect(activation.activationId).toStartWith("act_");
    expect((await app.heartbeat()).licenseStatus).toBe("active");
  },
);

test("two-factor: TWO_FACTOR_REQUIRED keeps the code, then the authenticator code gets the token", async () => {
  const totp = await enableTotp(t, f.userId);
  const app = client();
  const started = await app.startEmailVerification({ licenseKey: f.licenseKey, email: f.email });
  const code = await smtp.waitForCode(f.email);
  const required = await sdkError(
    app.confirmEmailVerification({ verificationId: started.verificationId, code }),
  );
  expect(required.code).toBe("TWO_FACTOR_REQUIRED");
  expect(required.kind).toBe("server");
  const token = await app.confirmEmailVerification({
    verificationId: started.verificationId,
    code,
    secondFactorCode: totp.codeAt(),
  });
  expect(token.namedUserToken).toStartWith("nut_");
});

test("a malformed code is refused before any request", async () => {
  const error = await sdkError(client().confirmEmailVerification({ verificationId: "ver_x", code: "12345" }));
  expect(error.code).toBe("INVALID_ARGUMENT");
});

test("a signed NAMED_USER_ASSIGNMENT_UNAVAILABLE on a heartbeat makes the license invalid (reason unassigned)", async () => {
  const app = client();
  const started = await app.startEmailVerification({ licenseKey: f.licenseKey, email: f.email });
  const { namedUserToken } = await app.confirmEmailVerification({
    verificationId: started.verificationId,
    code: await smtp.waitForCode(f.email),
  });
  await app.activate({ licenseKey: f.licenseKey, machineInfo: { os: "linux", arch: "x64" }, namedUserToken });
  expect((await app.licenseInfo()).state).toBe("valid");
  await t.call("DELETE", `/mgmt/v1/license-assignments/${f.assignmentId}`);
  const refused = await sdkError(app.heartbeat());
  expect(refused.code).toBe("NAMED_USER_ASSIGNMENT_UNAVAILABLE");
  expect(refused.kind).toBe("license");
  expect(refused.details.signed).toBe(true);
  expect(await app.licenseInfo()).toMatchObject({ state: "invalid", reason: "unassigned" });
});
