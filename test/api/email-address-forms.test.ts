import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { silentLogger } from "../../src/http/logger.ts";
import { MailOutbox } from "../../src/mail/outbox.ts";
import { fileTransport, smtpTransport } from "../../src/mail/transport.ts";
import { MailWorker } from "../../src/mail/worker.ts";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { namedUserFixture, startVerification } from "../support/named-users.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";
import {
  confirmTrial,
  freshEmail,
  startTrial,
  type TrialFixture,
  trialConfirmBody,
  trialFixture,
} from "../support/trials.ts";

/**
 * Security review: `x1<victim@example.com>` passed the loose address pattern, was one address to
 * the send limits and the reuse window (its HMAC) and another to nodemailer (which read the display
 * name out of it), so anyone could mail-bomb a mailbox and take unlimited trials. Every address a
 * caller gives is now a plain addr-spec, and the transport never parses one.
 */
let smtp: TestSmtpServer;
let t: TestContext;
let stopMail: () => Promise<void>;
beforeAll(async () => {
  smtp = await startSmtpServer();
});
afterAll(() => smtp.stop());
beforeEach(() => {
  t = createTestContext();
  stopMail = deliverMail(t.deps, smtp.url);
});
afterEach(async () => {
  await stopMail();
  t.close();
});

const WRAPPED = [
  "x1<VICTIM>",
  "<VICTIM>",
  "Name <VICTIM>",
  "a@example.com,VICTIM",
  "VICTIM (x)",
  '"x"@example.com',
];
const forms = (victim: string) => WRAPPED.map((form) => form.replace("VICTIM", victim));
const delivered = (victim: string) =>
  smtp.messages.filter((m) => m.to.some((to) => to.toLowerCase() === victim)).length;

describe("trial verification", () => {
  let fx: TrialFixture;
  beforeEach(async () => {
    fx = await trialFixture(t);
  });

  test("twenty starts with display-name forms of one mailbox are 422 and mail it nothing", async () => {
    const victim = freshEmail("victim");
    for (let i = 0; i < 20; i++) {
      const response = await startTrial(t, fx.productId, `x${i}<${victim}>`, new TestDevice());
      expect(response.status).toBe(422);
      expect(response.body.error.code).toBe("VALIDATION_FAILED");
    }
    for (const form of forms(victim)) {
      expect((await startTrial(t, fx.productId, form, new TestDevice())).status).toBe(422);
    }
    await Bun.sleep(300);
    expect(delivered(victim)).toBe(0);
  });

  test("the code goes to the address as typed (domain lower-cased), and limits key on its lower-case form", async () => {
    const local = `Mixed.${Math.random().toString(36).slice(2, 8)}`;
    const typed = `${local}@Example.COM`;
    expect((await startTrial(t, fx.productId, typed, new TestDevice())).status).toBe(202);
    const mail = await smtp.waitForMail(`${local.toLowerCase()}@example.com`);
    expect(mail.raw).toContain(`To: ${local}@example.com`);
    // The same mailbox in another case is inside the 120 s gap: no second mail.
    expect((await startTrial(t, fx.productId, typed.toLowerCase(), new TestDevice())).status).toBe(202);
    await Bun.sleep(300);
    expect(delivered(`${local.toLowerCase()}@example.com`)).toBe(1);
  });

  test("a confirm naming the address in display-name form is 422", async () => {
    const email = freshEmail("confirm");
    const device = new TestDevice();
    const started = await startTrial(t, fx.productId, email, device);
    const code = await smtp.waitForCode(email);
    const response = await confirmTrial(
      t,
      started.body.data.verification_id,
      trialConfirmBody(t, device, { code, email: `x<${email}>` }),
    );
    expect(response.status).toBe(422);
  });
});

test("an email verification start with a display-name form is 422 and mails nothing", async () => {
  const f = await namedUserFixture(t);
  for (const form of forms(f.email)) {
    const response = await startVerification(t, new TestDevice(), f, form);
    expect(response.status).toBe(422);
  }
  await Bun.sleep(300);
  expect(delivered(f.email)).toBe(0);
});

describe("management addresses", () => {
  test("a license user with a display-name form is 422, on create and on update", async () => {
    for (const form of forms("ada@example.com")) {
      const response = await t.call("POST", "/mgmt/v1/license-users", { body: { email: form } });
      expect(response.status).toBe(422);
      expect(response.body.error.details.errors.email).toBeDefined();
    }
    const user = await t.call("POST", "/mgmt/v1/license-users", { body: { email: "ada@example.com" } });
    const update = await t.call("PATCH", `/mgmt/v1/license-users/${user.body.data.public_id}`, {
      body: { email: "Ada <ada@example.com>" },
    });
    expect(update.status).toBe(422);
  });

  test("a license user's international domain is stored as punycode, and unique in any spelling", async () => {
    const created = await t.call("POST", "/mgmt/v1/license-users", { body: { email: "Ada@Bücher.example" } });
    expect(created.status).toBe(201);
    expect(created.body.data.email).toBe("Ada@xn--bcher-kva.example");
    const again = await t.call("POST", "/mgmt/v1/license-users", {
      body: { email: "ada@xn--bcher-kva.example" },
    });
    expect(again.status).toBe(422);
    const listed = await t.call("GET", "/mgmt/v1/license-users?email=ADA@B%C3%BCcher.example");
    expect(listed.body.data.map((u: { public_id: string }) => u.public_id)).toEqual([
      created.body.data.public_id,
    ]);
  });

  test("a customer email with display-name syntax is 422", async () => {
    for (const form of forms("ada@example.com")) {
      const response = await t.call("POST", "/mgmt/v1/customers", {
        body: { name: "Ada", email: form },
        headers: t.idem(),
      });
      expect(response.status).toBe(422);
    }
  });
});

describe("the mail transport never reads a display name out of a recipient", () => {
  const queue = (recipient: string) => {
    const outbox = new MailOutbox(t.deps);
    t.deps.db.transaction((tx) =>
      outbox.enqueue(tx, {
        to: recipient,
        template: "email_verification_code",
        data: { code: "123456", product_name: "Acme", expires_minutes: "10" },
      }),
    );
  };

  test("over SMTP, a stored recipient in display-name or list form reaches neither mailbox inside it", async () => {
    const victim = freshEmail("smtp-victim");
    await stopMail();
    queue(`x1<${victim}>`);
    queue(`someone@example.com, ${victim}`);
    const worker = new MailWorker(t.deps, smtpTransport(smtp.url), {
      from: "L <l@example.test>",
      logger: silentLogger,
    });
    await worker.runOnce();
    stopMail = deliverMail(t.deps, smtp.url);
    expect(delivered(victim)).toBe(0);
    expect(smtp.messages.filter((m) => m.to.includes("someone@example.com"))).toHaveLength(0);
  });

  test("to a file, the To header is the stored recipient as one address, never a name and another address", async () => {
    const dir = mkdtempSync(join(tmpdir(), "mail-forms-"));
    try {
      await stopMail();
      queue("x1<victim@example.com>");
      const worker = new MailWorker(t.deps, fileTransport(dir), {
        from: "L <l@example.test>",
        logger: silentLogger,
      });
      await worker.runOnce();
      stopMail = deliverMail(t.deps, smtp.url);
      for (const file of readdirSync(dir)) {
        const head = readFileSync(join(dir, file), "utf8").split("\r\n\r\n")[0] ?? "";
        expect(head).not.toMatch(/^To: x1 <victim@example\.com>/m);
        expect(head).not.toMatch(/^To: victim@example\.com/m);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
