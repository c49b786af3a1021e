import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import {
  confirmVerification,
  type NamedUserFixture,
  namedUserFixture,
  startVerification,
} from "../support/named-users.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";

/**
 * Security review: an email-verification start had no send limits, so anyone with a (shared team)
 * license key could mail-bomb a coworker, replace their open verification at will, and, with 5
 * guesses per start and unlimited starts, brute-force a six-digit code. Now: 120 s between codes
 * to an address, 5 per hour and 20 per 24 hours; a start held back neither mails nor replaces; and
 * 10 wrong codes in 24 hours close a user's verifications until the window has passed.
 */
let smtp: TestSmtpServer;
let t: TestContext;
let stopMail: () => Promise<void>;
let f: NamedUserFixture;
beforeAll(async () => {
  smtp = await startSmtpServer();
});
afterAll(() => smtp.stop());
beforeEach(async () => {
  t = createTestContext();
  stopMail = deliverMail(t.deps, smtp.url);
  f = await namedUserFixture(t);
});
afterEach(async () => {
  await stopMail();
  t.close();
});

/** Rows the outbox will send to the fixture's user (a held-back start's row is suppressed). */
const mailsTo = (email: string) =>
  t.deps.sqlite
    .query<{ n: number }, [string]>(
      "SELECT count(*) AS n FROM mail_outbox WHERE lower(recipient) = lower(?) AND status != 'suppressed'",
    )
    .get(email)?.n ?? 0;

async function start(device = new TestDevice(), email = f.email) {
  const response = await startVerification(t, device, f, email);
  expect(response.status).toBe(202);
  return { id: response.body.data.verification_id as string, data: response.body.data, device };
}

const wrong = (code: string) => String((Number(code) + 1) % 1_000_000).padStart(6, "0");

describe("send limits", () => {
  test("a second start within 120 s, from any device key and in any case, mails nothing and answers the same 202", async () => {
    const first = await start();
    expect(first.data.resend_after_sec).toBe(120);
    const second = await start(new TestDevice(), f.email.toUpperCase());
    expect(Object.keys(second.data).sort()).toEqual(Object.keys(first.data).sort());
    expect(second.data.resend_after_sec).toBe(120);
    expect(mailsTo(f.email)).toBe(1);
    t.clock.advance(121);
    await start();
    expect(mailsTo(f.email)).toBe(2);
  });

  test("a start held back by the limit leaves the user's open verification usable", async () => {
    const victim = await start();
    const code = await smtp.waitForCode(f.email);
    // Someone else with the same license key asks again for the same address within the gap.
    const attacker = await start();
    expect((await confirmVerification(t, victim.device, victim.id, code)).status).toBe(200);
    // The held-back verification matches no code.
    expect((await confirmVerification(t, attacker.device, attacker.id, code)).status).toBe(401);
  });

  test("however often starts are held back, the user's verification stays usable and only the newest held-back one stays open", async () => {
    const victim = await start();
    const code = await smtp.waitForCode(f.email);
    const held = [await start(), await start(), await start()];
    // Each held-back start closed the one before it: it never had a code to confirm.
    for (const earlier of held.slice(0, -1))
      expect((await confirmVerification(t, earlier.device, earlier.id, code)).status).toBe(410);
    expect((await confirmVerification(t, victim.device, victim.id, code)).status).toBe(200);
    expect(mailsTo(f.email)).toBe(1);
  });

  test("at most 5 codes to a user per hour and 20 per 24 hours, however many starts", async () => {
    for (let i = 0; i < 30; i++) {
      await start();
      t.clock.advance(121);
    }
    // 30 starts over about an hour: 5 in the first hour, and the 30th after it.
    expect(mailsTo(f.email)).toBeLessThanOrEqual(6);
    expect(mailsTo(f.email)).toBeGreaterThanOrEqual(5);
    for (let hour = 0; hour < 30; hour++) {
      t.clock.advance(3600 / 4);
      await start();
    }
    // Thirty more over 7.5 hours: never more than 20 in any 24 hours.
    expect(mailsTo(f.email)).toBe(20);
    t.clock.advance(24 * 3600);
    await start();
    expect(mailsTo(f.email)).toBe(21);
  });

  test("a held-back start for an address with no user does the same (no mail either way)", async () => {
    await start(new TestDevice(), "nobody@example.com");
    await start(new TestDevice(), "nobody@example.com");
    expect(mailsTo("nobody@example.com")).toBe(0);
  });
});

describe("a user's wrong-code budget across verifications", () => {
  test("after 10 wrong codes in 24 hours even the right code is 410 for that user, until the window passes", async () => {
    const device = new TestDevice();
    for (let round = 0; round < 2; round++) {
      const { id } = await start(device);
      const code = await smtp.waitForCode(f.email);
      for (let i = 0; i < 5; i++) {
        expect((await confirmVerification(t, device, id, wrong(code))).status).toBe(401);
      }
      t.clock.advance(121);
    }
    const { id } = await start(device);
    const code = await smtp.waitForCode(f.email);
    const refused = await confirmVerification(t, device, id, code);
    expect(refused.status).toBe(410);
    expect(refused.body.error.code).toBe("EMAIL_VERIFICATION_EXPIRED");
    // The refusal used no attempt: the count is not a guessing oracle either.
    const row = t.deps.sqlite
      .query<{ attempts: number }, [string]>("SELECT attempts FROM email_verifications WHERE id = ?")
      .get(id);
    expect(row?.attempts).toBe(0);
    // Another user is not affected.
    const other = await namedUserFixture(t);
    const otherStart = await startVerification(t, device, other, other.email);
    const otherCode = await smtp.waitForCode(other.email);
    expect(
      (await confirmVerification(t, device, otherStart.body.data.verification_id, otherCode)).status,
    ).toBe(200);
    // A day after the wrong guesses the user signs in again.
    t.clock.advance(24 * 3600);
    const later = await start(device);
    const laterCode = await smtp.waitForCode(f.email);
    expect((await confirmVerification(t, device, later.id, laterCode)).status).toBe(200);
  });

  test("nine wrong codes still leave the right one working", async () => {
    const device = new TestDevice();
    const first = await start(device);
    const firstCode = await smtp.waitForCode(f.email);
    for (let i = 0; i < 5; i++) await confirmVerification(t, device, first.id, wrong(firstCode));
    t.clock.advance(121);
    const second = await start(device);
    const code = await smtp.waitForCode(f.email);
    for (let i = 0; i < 4; i++) await confirmVerification(t, device, second.id, wrong(code));
    expect((await confirmVerification(t, device, second.id, code)).status).toBe(200);
  });
});
