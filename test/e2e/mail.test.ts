import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { TestDevice } from "../support/device.ts";
import { startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";
import {
  api,
  BUILD_TIMEOUT_MS,
  freePort,
  initialisedDataDir,
  removeTempDirs,
  type ServerProcess,
  startServe,
} from "./binary.ts";

/**
 * Issue 8 "mail enqueue": the mail carrying a code is written in the same transaction as the
 * verification, so `kill -9` right after the API answered loses nothing: the restarted executable
 * sends it. Also the default transport, which writes .eml files to <data>/outbox.
 */
const servers: ServerProcess[] = [];
let smtp: TestSmtpServer | undefined;

beforeAll(async () => {
  await initialisedDataDir();
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const server of servers) if (server.proc.exitCode === null) await server.stop("SIGKILL");
  await smtp?.stop();
  removeTempDirs();
});

async function namedUser(url: string, key: string, email: string) {
  const product = await api(url, key, "POST", "/mgmt/v1/products", {
    name: "Mail",
    code: `mail-${Math.random().toString(36).slice(2, 8)}`,
    environment: "live",
  });
  const productId = product.body.data.public_id;
  const policy = await api(url, key, "POST", "/mgmt/v1/policies", {
    product_id: productId,
    name: "Named",
    identity_mode: "named_user",
  });
  const license = await api(url, key, "POST", "/mgmt/v1/licenses", {
    product_id: productId,
    policy_id: policy.body.data.public_id,
  });
  const user = await api(url, key, "POST", "/mgmt/v1/license-users", { email });
  const assigned = await api(
    url,
    key,
    "POST",
    `/mgmt/v1/licenses/${license.body.data.public_id}/assignments`,
    {
      user_id: user.body.data.public_id,
    },
  );
  expect(assigned.status).toBe(201);
  return { productId, licenseKey: license.body.data.key as string };
}

const startBody = (
  fixture: { productId: string; licenseKey: string },
  email: string,
  device: TestDevice,
) => ({
  product_id: fixture.productId,
  license_key: fixture.licenseKey,
  email,
  device_signing_public_key: device.signingPublic,
  nonce: `nonce-${Math.random().toString(36).slice(2)}-padding`,
});

test(
  "kill -9 right after the 202 loses no mail: the restarted server delivers the code once SMTP is up",
  async () => {
    const { dataDir, liveKey } = await initialisedDataDir();
    const smtpPort = await freePort();
    // No SMTP server yet: the first process cannot send, whatever it tries.
    const env = {
      LICENSING_SMTP_URL: `smtp://127.0.0.1:${smtpPort}`,
      LICENSING_MAIL_FROM: "Licensing <l@e2e.test>",
    };
    let server = await startServe(["--data-dir", dataDir], { env });
    servers.push(server);
    const email = "crash@example.com";
    const fixture = await namedUser(server.url, liveKey, email);
    const device = new TestDevice();
    const started = await api(
      server.url,
      null,
      "POST",
      "/runtime/v1/email-verifications",
      startBody(fixture, email, device),
    );
    expect(started.status).toBe(202);
    await server.stop("SIGKILL");

    smtp = await startSmtpServer({ port: smtpPort });
    server = await startServe(["--data-dir", dataDir], { env });
    servers.push(server);
    // The first process may have tried once already: the retry comes after its first backoff (10 s).
    const mail = await smtp.waitForMail(email, 20_000);
    expect(mail.from).toBe("l@e2e.test");
    const confirmed = await api(
      server.url,
      null,
      "POST",
      `/runtime/v1/email-verifications/${started.body.data.verification_id}/confirm`,
      {
        code: mail.code,
        device_signing_public_key: device.signingPublic,
        nonce: `nonce-${Math.random().toString(36).slice(2)}-padding`,
      },
    );
    expect(confirmed.status).toBe(200);
    expect(confirmed.body.data.named_user_token).toStartWith("nut_");
    expect(await server.stop("SIGTERM")).toBe(0);
  },
  BUILD_TIMEOUT_MS,
);

test("without an SMTP URL each mail is written as an .eml file under <data>/outbox", async () => {
  const { dataDir, liveKey } = await initialisedDataDir();
  const server = await startServe(["--data-dir", dataDir]);
  servers.push(server);
  const email = "eml@example.com";
  const fixture = await namedUser(server.url, liveKey, email);
  const started = await api(
    server.url,
    null,
    "POST",
    "/runtime/v1/email-verifications",
    startBody(fixture, email, new TestDevice()),
  );
  expect(started.status).toBe(202);
  const outbox = join(dataDir, "outbox");
  const deadline = Date.now() + 5_000;
  while (
    !(existsSync(outbox) && readdirSync(outbox).some((n) => n.endsWith(".eml"))) &&
    Date.now() < deadline
  ) {
    await Bun.sleep(25);
  }
  const files = readdirSync(outbox).filter((n) => n.endsWith(".eml"));
  expect(files).toHaveLength(1);
  const eml = readFileSync(join(outbox, files[0] as string), "utf8");
  expect(eml).toContain(`To: ${email}`);
  expect(eml).toMatch(/^Subject: \d{6} is your Mail verification code/m);
  expect(await server.stop("SIGTERM")).toBe(0);
});
