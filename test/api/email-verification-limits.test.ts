import { Database } from "bun:sqlite";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { VerificationLimits } from "../../src/modules/email-verifications/limits.ts";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import {
  confirmVerification,
  type NamedUserFixture,
  namedUserFixture,
  otherLicense,
  startVerification,
} from "../support/named-users.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";

/**
 * Security review: an email-verification start had no send limits, so anyone with a (shared team)
 * license key could mail-bomb a coworker, replace their open verification at will, and, with 5
 * guesses per start and unlimited starts, brute-force a six-digit code. Now: 120 s between codes
 * to an address, 5 per hour and 20 per 24 hours; a start held back neither mails nor replaces; and
 * 10 wrong codes in 24 hours close a license key and address's verifications until the window has
 * passed. A later review: the limits counted mailed codes only, so an address without a user was
 * never held back and never ran out of wrong codes, and the confirm's answer (410 against 401)
 * told it from a user's without any timing. Now they count every start they let through, per
 * license key and address, and only the mailbox's own limit counts mailed codes.
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

async function start(
  device = new TestDevice(),
  email = f.email,
  fixture: Pick<NamedUserFixture, "productId" | "licenseKey"> = f,
) {
  const response = await startVerification(t, device, fixture, email);
  expect(response.status).toBe(202);
  return { id: response.body.data.verification_id as string, data: response.body.data, device };
}

/**
 * A device that started none of the verifications: its confirms never match (the device key is
 * checked with the code), so a test comparing answers cannot pass or fail by guessing a code.
 */
const stranger = new TestDevice();

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

  test("the mailbox is one across environments: a code mailed through live holds back test's for 120 s, and 20 a day in all", async () => {
    const testSide = await namedUserFixture(t, { key: t.keys.test, email: f.email });
    await start();
    await start(new TestDevice(), f.email, testSide);
    expect(mailsTo(f.email)).toBe(1);
    t.clock.advance(121);
    await start(new TestDevice(), f.email, testSide);
    expect(mailsTo(f.email)).toBe(2);
    // Alternating, 721 s apart: within the hourly limit, so only the daily one can stop them.
    for (let i = 0; i < 30; i++) {
      t.clock.advance(721);
      await start(new TestDevice(), f.email, i % 2 === 0 ? f : testSide);
    }
    expect(mailsTo(f.email)).toBe(20);
  });
});

describe("the limits do not tell an address with a user from one without", () => {
  test("confirming the older of two starts inside the gap answers 401 for an unknown address, as for a user", async () => {
    for (const email of [f.email, "nobody@example.com"]) {
      const older = await start(new TestDevice(), email);
      await start(new TestDevice(), email);
      // Held back, the newer start leaves the older open, whether or not it mailed a code.
      const answer = await confirmVerification(t, stranger, older.id, "000000");
      expect({ email, status: answer.status, code: answer.body.error.code }).toEqual({
        email,
        status: 401,
        code: "EMAIL_VERIFICATION_CODE_INVALID",
      });
    }
  });

  test("past the gap, a start replaces the older verification for an unknown address as for a user", async () => {
    for (const email of [f.email, "nobody@example.com"]) {
      const older = await start(new TestDevice(), email);
      t.clock.advance(121);
      await start(new TestDevice(), email);
      const answer = await confirmVerification(t, stranger, older.id, "000000");
      expect({ email, status: answer.status }).toEqual({ email, status: 410 });
    }
  });

  test("an unknown address is held back by its own starts as a user is: the sixth in an hour leaves the fifth open", async () => {
    for (const email of [f.email, "nobody@example.com"]) {
      const starts: { id: string; device: TestDevice }[] = [];
      for (let i = 0; i < 6; i++) {
        if (i > 0) t.clock.advance(121);
        starts.push(await start(new TestDevice(), email));
      }
      // Five counted in the hour: the sixth is held back and the fifth stays open.
      const fifth = starts[4] as { id: string; device: TestDevice };
      const answer = await confirmVerification(t, stranger, fifth.id, "000000");
      expect({ email, status: answer.status }).toEqual({ email, status: 401 });
    }
    expect(mailsTo(f.email)).toBe(5);
  });

  test("a code mailed through the license does not show in another subject of the address (a made-up key)", async () => {
    const unassigned = await t.call("POST", "/mgmt/v1/license-users", {
      body: { email: "unassigned@example.com", name: "Not assigned" },
    });
    expect(unassigned.status).toBe(201);
    const madeUp = { productId: f.productId, licenseKey: "not-a-license-key" };
    for (const email of [f.email, "nobody@example.com", "unassigned@example.com"]) {
      const observer = await start(new TestDevice(), email, madeUp);
      t.clock.advance(121);
      // Mails a code only if the address is a user of the license: the mailbox is then full for 120 s.
      await start(new TestDevice(), email);
      t.clock.advance(1);
      // The made-up key's own limit lets this through whatever the mailbox holds, so it replaces.
      await start(new TestDevice(), email, madeUp);
      const answer = await confirmVerification(t, stranger, observer.id, "000000");
      expect({ email, status: answer.status }).toEqual({ email, status: 410 });
    }
    expect(mailsTo(f.email)).toBe(1);
  });

  test("past the wrong-code budget, an unknown address's verification answers 410 as a user's does", async () => {
    for (const email of [f.email, "nobody@example.com"]) {
      const device = new TestDevice();
      for (let round = 0; round < 2; round++) {
        const { id } = await start(device, email);
        for (let i = 0; i < 5; i++)
          expect((await confirmVerification(t, stranger, id, "000000")).status).toBe(401);
        t.clock.advance(121);
      }
      const { id } = await start(device, email);
      const answer = await confirmVerification(t, stranger, id, "000000");
      expect({ email, status: answer.status, code: answer.body.error.code }).toEqual({
        email,
        status: 410,
        code: "EMAIL_VERIFICATION_EXPIRED",
      });
    }
  });
});

describe("a license the user is not assigned to cannot spend their limits", () => {
  test("starts and wrong codes for the user's address with another license key leave the user's sign-in alone", async () => {
    const other = await otherLicense(t, f);
    const device = new TestDevice();
    // As many starts in the hour as a subject may count, the last just now, and ten wrong codes.
    for (let round = 0; round < 5; round++) {
      if (round > 0) t.clock.advance(121);
      const { id } = await start(device, f.email, other);
      if (round < 2) for (let i = 0; i < 5; i++) await confirmVerification(t, device, id, "000000");
    }
    // The other license's starts mailed nothing: the user is not assigned to it.
    expect(mailsTo(f.email)).toBe(0);
    const own = await start(device);
    expect(mailsTo(f.email)).toBe(1);
    const code = await smtp.waitForCode(f.email);
    expect((await confirmVerification(t, device, own.id, code)).status).toBe(200);
  });

  test("a start the mailbox keeps from mailing still replaces its license's pending code (the documented cost of the mailbox deciding nothing else)", async () => {
    const other = await otherLicense(t, f, f.userId);
    const device = new TestDevice();
    const pending = await start(device);
    const code = await smtp.waitForCode(f.email);
    t.clock.advance(121);
    await start(new TestDevice(), f.email, other);
    expect(mailsTo(f.email)).toBe(2);
    t.clock.advance(10);
    await start(new TestDevice());
    expect(mailsTo(f.email)).toBe(2);
    expect((await confirmVerification(t, device, pending.id, code)).status).toBe(410);
  });

  test("a user assigned to two licenses gets at most one code per 120 s across them", async () => {
    const other = await otherLicense(t, f, f.userId);
    await start();
    expect(mailsTo(f.email)).toBe(1);
    await start(new TestDevice(), f.email, other);
    expect(mailsTo(f.email)).toBe(1);
    t.clock.advance(121);
    await start(new TestDevice(), f.email, other);
    expect(mailsTo(f.email)).toBe(2);
  });
});

describe("a license key and address's wrong-code budget across verifications", () => {
  test("after 10 wrong codes in 24 hours even the right code is 410 for that license key and address, until the window passes", async () => {
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

describe("the limits' statements", () => {
  test("each searches an index by its subject or address and time, never scanning the table", async () => {
    const { sql } = await sqlPreparedDuring(Database.prototype, () => new VerificationLimits(t.deps.sqlite));
    const plans = sql
      .filter((text) => text.includes("email_verifications"))
      .map((text) => queryPlan(t.deps.sqlite, text));
    expect(plans).toEqual([
      expect.stringMatching(
        /^SEARCH email_verifications USING (COVERING )?INDEX email_verifications_subject_counted \(subject_hash=\? AND counted=\? AND created_at>\?\)$/,
      ),
      expect.stringMatching(
        /^SEARCH email_verifications USING (COVERING )?INDEX email_verifications_address \(address_hash=\? AND created_at>\?\)$/,
      ),
      expect.stringMatching(
        /^SEARCH email_verifications USING (COVERING )?INDEX email_verifications_subject_counted \(subject_hash=\? AND counted=\? AND created_at>\?\)$/,
      ),
    ]);
  });
});
