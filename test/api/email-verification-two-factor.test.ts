import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { Secret, TOTP } from "otpauth";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import {
  confirmVerification,
  enableTotp,
  type NamedUserFixture,
  namedUserFixture,
  startedWithMailedCode,
} from "../support/named-users.ts";
import { SoftAuthenticator } from "../support/passkey.ts";
import { activate } from "../support/runtime.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";

/** The second factor at email confirmation (spec §4.2 rule 7): TOTP, recovery codes, the lock. */
let t: TestContext;
let smtp: TestSmtpServer;
let stopMail: () => Promise<void>;
let f: NamedUserFixture;
let device: TestDevice;

beforeEach(async () => {
  t = createTestContext();
  smtp = await startSmtpServer();
  stopMail = deliverMail(t.deps, smtp.url);
  f = await namedUserFixture(t);
  device = new TestDevice();
});
afterEach(async () => {
  await stopMail();
  await smtp.stop();
  t.close();
});

const started = (email = f.email, who = device) => startedWithMailedCode(t, smtp, f, email, who);

const userEtag = async () =>
  (await t.call("GET", `/mgmt/v1/license-users/${f.userId}`)).headers.get("etag") as string;

describe("two-factor at confirm", () => {
  test("without the second factor: 401 TWO_FACTOR_REQUIRED and the code stays valid; with a TOTP code: the token", async () => {
    const totp = await enableTotp(t, f.userId);
    const { id, code } = await started();
    const required = await confirmVerification(t, device, id, code);
    expect(required.status).toBe(401);
    expect(required.body.error.code).toBe("TWO_FACTOR_REQUIRED");
    expect(required.body.error.details.remaining_attempts).toBe(5);
    const ok = await confirmVerification(t, device, id, code, { second_factor_code: totp.codeAt() });
    expect(ok.status).toBe(200);
    const activation = await activate(t, device, f, {
      body: { named_user_token: ok.body.data.named_user_token },
    });
    expect(activation.status).toBe(201);
  });

  test("a TOTP step is never accepted twice, and a wrong one is TWO_FACTOR_INVALID using an attempt", async () => {
    const totp = await enableTotp(t, f.userId);
    const first = await started();
    const step = totp.codeAt();
    expect(
      (await confirmVerification(t, device, first.id, first.code, { second_factor_code: step })).status,
    ).toBe(200);
    const second = await started();
    const replay = await confirmVerification(t, device, second.id, second.code, { second_factor_code: step });
    expect(replay.status).toBe(401);
    expect(replay.body.error.code).toBe("TWO_FACTOR_INVALID");
    expect(replay.body.error.details.remaining_attempts).toBe(4);
    t.clock.advance(30);
    expect(
      (await confirmVerification(t, device, second.id, second.code, { second_factor_code: totp.codeAt() }))
        .status,
    ).toBe(200);
  });

  test("a recovery code works once, in any case and without the dash; using one makes an If-Match read before it stale", async () => {
    const totp = await enableTotp(t, f.userId);
    expect(totp.recoveryCodes).toHaveLength(10);
    expect(totp.uri).toStartWith("otpauth://totp/");
    const recovery = totp.recoveryCodes[0] as string;
    const seen = await userEtag();
    const first = await started();
    const typed = recovery.replace("-", "").toLowerCase();
    expect(
      (await confirmVerification(t, device, first.id, first.code, { second_factor_code: typed })).status,
    ).toBe(200);
    const second = await started();
    const again = await confirmVerification(t, device, second.id, second.code, {
      second_factor_code: recovery,
    });
    expect(again.body.error.code).toBe("TWO_FACTOR_INVALID");
    const user = await t.call("GET", `/mgmt/v1/license-users/${f.userId}`);
    expect(user.body.data.two_factor.recovery_codes_remaining).toBe(9);
    // The vendor saw ten codes left; turning two-factor off on that view is refused.
    const stale = await t.call("DELETE", `/mgmt/v1/license-users/${f.userId}/two-factor`, {
      headers: { "if-match": seen },
    });
    expect([stale.status, stale.body.error.code]).toEqual([409, "VERSION_CONFLICT"]);
    expect((await t.call("GET", `/mgmt/v1/license-users/${f.userId}`)).body.data.two_factor.status).toBe(
      "enabled",
    );
  });

  test("a TOTP enrolment not yet confirmed is no second factor: its codes and recovery codes are refused until the vendor confirms it", async () => {
    // A passkey makes two-factor required while the TOTP enrolment is pending.
    const link = await t.call(
      "POST",
      `/mgmt/v1/license-users/${f.userId}/two-factor/passkeys/registration-link`,
    );
    const token = link.body.data.url.split("#")[1];
    const options = await t.call("POST", "/passkeys/v1/register/options", { key: null, body: { token } });
    const passkey = new SoftAuthenticator("p256").create(options.body.data.challenge);
    const registered = await t.call("POST", "/passkeys/v1/register", {
      key: null,
      body: { token, ...passkey },
    });
    expect(registered.status).toBe(201);
    const enrolment = await t.call("POST", `/mgmt/v1/license-users/${f.userId}/two-factor/totp`);
    const totp = new TOTP({ secret: Secret.fromBase32(enrolment.body.data.secret), digits: 6, period: 30 });
    const codeNow = () => totp.generate({ timestamp: t.clock.now().getTime() });
    const recovery = enrolment.body.data.recovery_codes[0] as string;

    const { id, code } = await started();
    for (const second of [codeNow(), recovery]) {
      const refused = await confirmVerification(t, device, id, code, { second_factor_code: second });
      expect([refused.status, refused.body.error.code]).toEqual([401, "TWO_FACTOR_INVALID"]);
    }
    // The vendor's confirm takes a code of the pending secret; from then on it signs in.
    const confirmed = await t.call("POST", `/mgmt/v1/license-users/${f.userId}/two-factor/totp/confirm`, {
      body: { code: codeNow() },
    });
    expect([confirmed.status, confirmed.body.data.two_factor.status]).toEqual([200, "enabled"]);
    t.clock.advance(30);
    expect((await confirmVerification(t, device, id, code, { second_factor_code: codeNow() })).status).toBe(
      200,
    );
    const next = await started();
    const withRecovery = await confirmVerification(t, device, next.id, next.code, {
      second_factor_code: recovery,
    });
    expect(withRecovery.status).toBe(200);
  });

  test("ten wrong second factors in a row lock two-factor (403 TWO_FACTOR_LOCKED) until the vendor unlocks", async () => {
    const totp = await enableTotp(t, f.userId);
    const seen = await userEtag();
    for (let i = 0; i < 10; i++) {
      // Eleven codes: spread out, so at most 5 go out in any hour (the send limits).
      t.clock.advance(600);
      const { id, code } = await started();
      const wrong = await confirmVerification(t, device, id, code, { second_factor_code: "ZZZZZ-ZZZZZ" });
      expect(wrong.body.error.code).toBe("TWO_FACTOR_INVALID");
    }
    t.clock.advance(600);
    const { id, code } = await started();
    const locked = await confirmVerification(t, device, id, code, { second_factor_code: totp.codeAt() });
    expect(locked.status).toBe(403);
    expect(locked.body.error.code).toBe("TWO_FACTOR_LOCKED");
    // The lock shows on the user object, so it moved the ETag (the wrong codes before it did not).
    expect(await userEtag()).not.toBe(seen);
    expect((await t.call("GET", `/mgmt/v1/license-users/${f.userId}`)).body.data.two_factor.locked).toBe(
      true,
    );
    expect((await t.call("POST", `/mgmt/v1/license-users/${f.userId}/two-factor/unlock`)).status).toBe(200);
    expect(
      (await confirmVerification(t, device, id, code, { second_factor_code: totp.codeAt() })).status,
    ).toBe(200);
  });
});
