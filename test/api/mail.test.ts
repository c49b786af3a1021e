import { afterEach, beforeEach, expect, test } from "bun:test";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { join } from "node:path";
import { eq } from "drizzle-orm";
import { type LogLevel, silentLogger } from "../../src/http/logger.ts";
import { MailOutbox } from "../../src/mail/outbox.ts";
import { renderMail, resolveLocale } from "../../src/mail/templates.ts";
import { fileTransport, redactSmtpUrl, smtpTransport } from "../../src/mail/transport.ts";
import { MailWorker } from "../../src/mail/worker.ts";
import { mailOutbox } from "../../src/store/schema/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";

let t: TestContext;
let smtp: TestSmtpServer | undefined;
beforeEach(() => {
  t = createTestContext();
});
afterEach(async () => {
  await smtp?.stop();
  smtp = undefined;
  t.close();
});

const codeMail = (to: string, code = "123456") => ({
  to,
  template: "email_verification_code" as const,
  data: { code, product_name: "Acme Desktop", expires_minutes: "10" },
});

const row = (id: string) => t.deps.db.select().from(mailOutbox).where(eq(mailOutbox.id, id)).get();

test("a mail enqueued in a transaction is sent over SMTP with its code, text and HTML parts and the configured From", async () => {
  smtp = await startSmtpServer();
  const outbox = new MailOutbox(t.deps);
  const id = t.deps.db.transaction((tx) => outbox.enqueue(tx, codeMail("ada@example.com", "042917")));
  const worker = new MailWorker(t.deps, smtpTransport(smtp.url), {
    from: "Acme <no-reply@acme.test>",
    logger: silentLogger,
  });
  expect(await worker.runOnce()).toBe(1);
  const mail = await smtp.waitForMail("ada@example.com");
  expect(mail.code).toBe("042917");
  expect(mail.from).toBe("no-reply@acme.test");
  expect(mail.raw).toContain("text/plain");
  expect(mail.raw).toContain("text/html");
  expect(mail.raw).toContain(`Message-ID: <${id}@licensing.invalid>`);
  const sent = row(id);
  expect(sent?.status).toBe("sent");
  expect(sent?.payload).toBeNull();
  expect(await worker.runOnce()).toBe(0);
  expect(smtp.messages).toHaveLength(1);
});

test("a mail enqueued in a transaction that rolls back is never sent", async () => {
  smtp = await startSmtpServer();
  const outbox = new MailOutbox(t.deps);
  expect(() =>
    t.deps.db.transaction((tx) => {
      outbox.enqueue(tx, codeMail("ada@example.com"));
      throw new Error("the change failed");
    }),
  ).toThrow("the change failed");
  const worker = new MailWorker(t.deps, smtpTransport(smtp.url), { from: "a@b.test", logger: silentLogger });
  expect(await worker.runOnce()).toBe(0);
  expect(t.deps.db.select().from(mailOutbox).all()).toHaveLength(0);
});

test("the template data, codes included, is encrypted in the store while the mail waits", () => {
  const outbox = new MailOutbox(t.deps);
  const id = outbox.enqueue(t.deps.db, codeMail("ada@example.com", "918273"));
  const stored = row(id);
  expect(stored?.payload).toStartWith("v1.");
  expect(stored?.payload).not.toContain("918273");
  expect(readFileSync(join(t.dir, "licensing.db")).includes("918273")).toBe(false);
});

test("an SMTP outage is retried with backoff and the mail goes out once the server is back", async () => {
  smtp = await startSmtpServer();
  smtp.setDown(true);
  const outbox = new MailOutbox(t.deps);
  const id = outbox.enqueue(t.deps.db, codeMail("ada@example.com", "555111"));
  const worker = new MailWorker(t.deps, smtpTransport(smtp.url), {
    from: "a@b.test",
    logger: silentLogger,
    retryDelaysSec: [10, 60],
  });
  expect(await worker.runOnce()).toBe(0);
  let pending = row(id);
  expect(pending?.status).toBe("pending");
  expect(pending?.attempts).toBe(1);
  expect(pending?.lastError).toContain("451");
  // Not due yet: nothing is attempted before the backoff ends.
  smtp.setDown(false);
  expect(await worker.runOnce()).toBe(0);
  t.clock.advance(12);
  expect(await worker.runOnce()).toBe(1);
  expect((await smtp.waitForMail("ada@example.com")).code).toBe("555111");
  pending = row(id);
  expect(pending?.status).toBe("sent");
});

/**
 * An SMTP server that accepts everything up to the end of the message and then never finishes its
 * reply: a `250-` continuation line every 50 ms, so the connection is never idle.
 */
async function startTarpit() {
  const sockets = new Set<Socket>();
  let closed = 0;
  const server = createServer((socket) => {
    sockets.add(socket);
    let timer: ReturnType<typeof setInterval> | undefined;
    let inData = false;
    let buffered = "";
    socket.on("close", () => {
      clearInterval(timer);
      sockets.delete(socket);
      closed++;
    });
    socket.on("error", () => {});
    socket.write("220 tarpit ESMTP\r\n");
    socket.on("data", (chunk) => {
      buffered += chunk.toString("latin1");
      if (inData) {
        if (!buffered.includes("\r\n.\r\n")) return;
        inData = false;
        timer = setInterval(() => socket.write("250-still thinking\r\n"), 50);
        return;
      }
      let end = buffered.indexOf("\r\n");
      while (end >= 0) {
        const line = buffered.slice(0, end).toUpperCase();
        buffered = buffered.slice(end + 2);
        if (line.startsWith("EHLO")) socket.write("250-tarpit\r\n250 8BITMIME\r\n");
        else if (line.startsWith("DATA")) {
          inData = true;
          socket.write("354 go ahead\r\n");
          return;
        } else socket.write("250 ok\r\n");
        end = buffered.indexOf("\r\n");
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  return {
    url: `smtp://127.0.0.1:${port}`,
    openConnections: () => sockets.size,
    closedConnections: () => closed,
    stop() {
      for (const socket of sockets) socket.destroy();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

test("a server that never finishes its reply fails the send at the overall deadline, closes the connection, and the next mail is tried", async () => {
  const tarpit = await startTarpit();
  try {
    const outbox = new MailOutbox(t.deps);
    const first = outbox.enqueue(t.deps.db, codeMail("ada@example.com", "111111"));
    const second = outbox.enqueue(t.deps.db, codeMail("bob@example.com", "222222"));
    const worker = new MailWorker(t.deps, smtpTransport(tarpit.url, { sendDeadlineMs: 300 }), {
      from: "a@b.test",
      logger: silentLogger,
      retryDelaysSec: [10, 60],
    });
    // Without the deadline this never resolves: the socket timeout is an idle one, and the tarpit
    // is never idle.
    expect(await worker.runOnce()).toBe(0);
    for (const id of [first, second]) {
      const waiting = row(id);
      expect([waiting?.status, waiting?.attempts]).toEqual(["pending", 1]);
      expect(waiting?.lastError).toMatch(/abort/i);
    }
    // Both connections were reached and both are gone (closed by us, not left to the tarpit).
    await Bun.sleep(50);
    expect(tarpit.closedConnections()).toBeGreaterThanOrEqual(2);
    expect(tarpit.openConnections()).toBe(0);
  } finally {
    await tarpit.stop();
  }
});

test("a recipient the server refuses for good (550) is given up at once, and the log line does not name the address", async () => {
  smtp = await startSmtpServer({ refuseRecipients: ["gone@example.com"] });
  const outbox = new MailOutbox(t.deps);
  const id = outbox.enqueue(t.deps.db, codeMail("gone@example.com", "424242"));
  const lines: { msg: string; fields?: Record<string, unknown> }[] = [];
  const worker = new MailWorker(t.deps, smtpTransport(smtp.url), {
    from: "a@b.test",
    logger: { log: (_level, msg, fields) => lines.push({ msg, ...(fields ? { fields } : {}) }) },
    retryDelaysSec: [10, 60],
  });
  expect(await worker.runOnce()).toBe(0);
  const failed = row(id);
  expect([failed?.status, failed?.attempts, failed?.payload]).toEqual(["failed", 1, null]);
  expect(failed?.lastError).toContain("550");
  const given = lines.find((line) => line.msg === "mail given up");
  expect(given?.fields).toMatchObject({ mail_id: id, reason: "recipient_refused" });
  expect(JSON.stringify(lines)).not.toContain("gone@example.com");
  expect(String(given?.fields?.error)).toContain("550");
});

test("a mail is given up after the last retry, and the code it held is cleared", async () => {
  const outbox = new MailOutbox(t.deps);
  const id = outbox.enqueue(t.deps.db, codeMail("ada@example.com"));
  // Nothing listens on this port.
  const worker = new MailWorker(t.deps, smtpTransport("smtp://127.0.0.1:1"), {
    from: "a@b.test",
    logger: silentLogger,
    retryDelaysSec: [1],
  });
  await worker.runOnce();
  t.clock.advance(2);
  await worker.runOnce();
  const failed = row(id);
  expect(failed?.status).toBe("failed");
  expect(failed?.attempts).toBe(2);
  expect(failed?.payload).toBeNull();
});

test("without SMTP the default transport writes each mail as an .eml file under <data>/outbox", async () => {
  const dir = join(t.dir, "outbox");
  const outbox = new MailOutbox(t.deps);
  const id = outbox.enqueue(t.deps.db, codeMail("ada@example.com", "314159"));
  const worker = new MailWorker(t.deps, fileTransport(dir), {
    from: "Acme <no-reply@acme.test>",
    logger: silentLogger,
  });
  expect(await worker.runOnce()).toBe(1);
  expect(readdirSync(dir)).toEqual([`${id}.eml`]);
  // A mail may hold a sign-in code: its owner alone reads it.
  expect(statSync(join(dir, `${id}.eml`)).mode & 0o777).toBe(0o600);
  const eml = readFileSync(join(dir, `${id}.eml`), "utf8");
  expect(eml).toContain("To: ada@example.com");
  expect(eml).toContain("From: Acme <no-reply@acme.test>");
  expect(eml).toMatch(/^Subject: 314159 is your Acme Desktop verification code/m);
  expect(eml).toContain("\r\n");
});

test("STARTTLS with authentication: the session is encrypted and logs in with the URL's credentials", async () => {
  smtp = await startSmtpServer({ auth: { user: "mailer@acme.test", pass: "s3cret pa:ss/word" } });
  const outbox = new MailOutbox(t.deps);
  outbox.enqueue(t.deps.db, codeMail("ada@example.com", "777000"));
  const worker = new MailWorker(t.deps, smtpTransport(smtp.url), { from: "a@b.test", logger: silentLogger });
  expect(await worker.runOnce()).toBe(1);
  const mail = await smtp.waitForMail("ada@example.com");
  expect(mail.secure).toBe(true);
  expect(mail.user).toBe("mailer@acme.test");
});

test("implicit TLS (smtps://) delivers over an encrypted session", async () => {
  smtp = await startSmtpServer({ secure: true });
  expect(smtp.url).toStartWith("smtps://");
  const outbox = new MailOutbox(t.deps);
  outbox.enqueue(t.deps.db, codeMail("ada@example.com", "101010"));
  const worker = new MailWorker(t.deps, smtpTransport(smtp.url), { from: "a@b.test", logger: silentLogger });
  expect(await worker.runOnce()).toBe(1);
  expect((await smtp.waitForMail("ada@example.com")).secure).toBe(true);
});

test("a wrong SMTP password fails the send, is retried, and never appears in the log or the store", async () => {
  smtp = await startSmtpServer({ auth: { user: "mailer", pass: "right-password" } });
  const lines: string[] = [];
  const url = smtp.url.replace("right-password", "wrong-password-XYZ");
  const outbox = new MailOutbox(t.deps);
  const id = outbox.enqueue(t.deps.db, codeMail("ada@example.com"));
  const worker = new MailWorker(t.deps, smtpTransport(url), {
    from: "a@b.test",
    logger: { log: (_level, msg, fields) => lines.push(JSON.stringify({ msg, ...fields })) },
  });
  expect(await worker.runOnce()).toBe(0);
  expect(row(id)?.status).toBe("pending");
  expect(lines.join("\n")).toContain("mail send failed");
  expect(lines.join("\n")).not.toContain("wrong-password-XYZ");
  expect(readFileSync(join(t.dir, "licensing.db")).includes("wrong-password-XYZ")).toBe(false);
  expect(redactSmtpUrl(url)).not.toContain("wrong-password-XYZ");
});

test("templates escape data in HTML, keep subjects on one line and fall back to English for unknown locales", () => {
  const mail = renderMail("email_verification_code", "de-AT", {
    code: "123456",
    product_name: "<script>x</script>\r\nBcc: evil@example.com",
  });
  expect(mail.html).not.toContain("<script>");
  expect(mail.html).toContain("&#60;script&#62;");
  expect(mail.subject).not.toMatch(/[\r\n]/);
  expect(mail.text).toContain("123456");
  expect(resolveLocale("de-AT", "email_verification_code")).toBe("en");
  expect(resolveLocale("EN_gb", "trial_verification_code")).toBe("en");
  expect(resolveLocale(undefined, "trial_verification_code")).toBe("en");
});

test("a store that fails every poll is logged once a minute with how many were not, and its recovery once", async () => {
  smtp = await startSmtpServer();
  const lines: { level: LogLevel; msg: string; fields: Record<string, unknown> }[] = [];
  let nowMs = 0;
  const worker = new MailWorker(t.deps, smtpTransport(smtp.url), {
    from: "a@b.test",
    logger: { log: (level, msg, fields = {}) => lines.push({ level, msg, fields }) },
    monotonicMs: () => nowMs,
  });
  // Every poll's read fails, as on a store that cannot be used.
  t.deps.sqlite.run("ALTER TABLE mail_outbox RENAME TO mail_outbox_away");
  for (; nowMs < 60_000; nowMs += 2_000) await worker.poll();
  expect(lines.map((line) => [line.level, line.msg, line.fields.suppressed])).toEqual([
    ["error", "mail worker failed", 0],
  ]);
  await worker.poll();
  expect(lines.at(-1)).toMatchObject({
    level: "error",
    msg: "mail worker failed",
    fields: { suppressed: 29 },
  });
  t.deps.sqlite.run("ALTER TABLE mail_outbox_away RENAME TO mail_outbox");
  await worker.poll();
  await worker.poll();
  expect(lines.slice(2)).toEqual([
    { level: "info", msg: "mail worker recovered", fields: { suppressed: 0 } },
  ]);
});
