import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";
import {
  confirmTrial,
  freshEmail,
  mailsTo,
  signUp,
  startTrial,
  type TrialFixture,
  trialConfirmBody,
  trialFixture,
  unsentCode,
} from "../support/trials.ts";

/**
 * What bounds trial sign-ups: the same 202 whatever happens (rule 9), the send limits of spec §8
 * (also under parallel requests), the 24-hour daily_limit, the 365-day reuse window, the workspace
 * allowance, and environments.
 */
let smtp: TestSmtpServer;
let t: TestContext;
let fx: TrialFixture;
let stopMail: () => Promise<void>;

beforeAll(async () => {
  smtp = await startSmtpServer();
});
afterAll(() => smtp.stop());
beforeEach(async () => {
  t = createTestContext();
  stopMail = deliverMail(t.deps, smtp.url);
  fx = await trialFixture(t, { policy: { max_machines: 3 } });
});
afterEach(async () => {
  await stopMail();
  t.close();
});

const DAY = 86_400;
const delivered = (email: string) => smtp.messages.filter((m) => m.to.includes(email)).length;
/** The worker polls every 20 ms: after this, anything in the outbox has been delivered. */
const settle = () => Bun.sleep(250);
const shape = (data: Record<string, unknown>) => ({
  keys: Object.keys(data).sort(),
  resend_after_sec: data.resend_after_sec,
  code_length: data.code_length,
  id: typeof data.verification_id === "string" && /^ver_[0-9A-Z]{26}$/.test(data.verification_id),
});

describe("the same 202 whatever happens", () => {
  const cases: [string, () => Promise<string>][] = [
    [
      "no policy is chosen",
      async () => {
        await t.call("PATCH", `/mgmt/v1/products/${fx.productId}/trial-signup`, {
          body: { policy_id: null },
        });
        return fx.productId;
      },
    ],
    [
      "the plan lacks trial_licenses",
      async () => {
        t.workspace.setPlan("personal");
        return fx.productId;
      },
    ],
    [
      "the product is archived",
      async () => {
        await t.call("DELETE", `/mgmt/v1/products/${fx.productId}`);
        return fx.productId;
      },
    ],
    [
      "the chosen policy was retired",
      async () => {
        await t.call("DELETE", `/mgmt/v1/policies/${fx.trialPolicyId}`);
        return fx.productId;
      },
    ],
  ];

  test.each(cases)(
    "when %s, the start answers as usual and mails nothing; not even its own code confirms it",
    async (_name, arrange) => {
      const reference = await startTrial(t, fx.productId, freshEmail(), new TestDevice());
      const productId = await arrange();
      const email = freshEmail();
      const device = new TestDevice();
      const response = await startTrial(t, productId, email, device);
      expect(response.status).toBe(202);
      expect(shape(response.body.data)).toEqual(shape(reference.body.data));
      expect(response.body.response_signature).toBeString();
      await settle();
      expect(mailsTo(t, email)).toBe(0);
      expect(delivered(email)).toBe(0);
      const guess = await confirmTrial(
        t,
        response.body.data.verification_id,
        trialConfirmBody(t, device, { code: unsentCode(t, email), email }),
      );
      expect(guess.status).toBe(401);
      expect(guess.body.error.code).toBe("EMAIL_VERIFICATION_CODE_INVALID");
    },
  );

  test("a start the send limits silence holds a code that confirms nothing, so silent starts are no guesses at someone's trial", async () => {
    t.clock.freeze();
    const email = freshEmail("victim");
    const owner = new TestDevice();
    const mailed = await startTrial(t, fx.productId, email, owner);
    const code = await smtp.waitForCode(email);
    // Within 120 s: answered alike, mails nothing, and its code (read here from the suppressed
    // row; an attacker would guess it) is refused like a wrong one, attempt after attempt.
    const attacker = new TestDevice();
    const silent = await startTrial(t, fx.productId, email, attacker);
    expect(silent.status).toBe(202);
    expect(mailsTo(t, email)).toBe(1);
    const unsent = unsentCode(t, email);
    const refusals = [];
    for (let i = 0; i < 2; i++) {
      const guess = await confirmTrial(
        t,
        silent.body.data.verification_id,
        trialConfirmBody(t, attacker, { code: unsent, email }),
      );
      refusals.push([guess.status, guess.body.error?.code, guess.body.error?.details?.remaining_attempts]);
    }
    expect(refusals).toEqual([
      [401, "EMAIL_VERIFICATION_CODE_INVALID", 4],
      [401, "EMAIL_VERIFICATION_CODE_INVALID", 3],
    ]);
    const licensesOfProduct = t.deps.sqlite
      .query<{ n: number }, [string]>("SELECT count(*) AS n FROM licenses WHERE product_id = ?")
      .get(fx.productId)?.n;
    expect(licensesOfProduct).toBe(0);
    // The owner's mailed code still works.
    const confirmed = await confirmTrial(
      t,
      mailed.body.data.verification_id,
      trialConfirmBody(t, owner, { code, email }),
    );
    expect(confirmed.status).toBe(201);
  });

  test("an unknown product is 404 and a malformed device key 422", async () => {
    const unknown = await startTrial(t, "prod_01JZ8X4M6Q2T9V3B7N5K1R0W8Y", freshEmail(), new TestDevice());
    expect(unknown.status).toBe(404);
    const malformed = await startTrial(t, fx.productId, freshEmail(), new TestDevice(), {
      device_signing_public_key: "ed25519:AAAA",
    });
    expect(malformed.status).toBe(422);
    expect(malformed.body.error.details.errors.device_signing_public_key).toBeDefined();
  });
});

describe("send limits", () => {
  test("a second code to the same address waits 120 seconds", async () => {
    // 119 s must stay 119 s: real time ticking over a second boundary would make it 120.
    t.clock.freeze();
    const email = freshEmail();
    await startTrial(t, fx.productId, email, new TestDevice());
    await startTrial(t, fx.productId, email, new TestDevice());
    t.clock.advance(119);
    await startTrial(t, fx.productId, email, new TestDevice());
    expect(mailsTo(t, email)).toBe(1);
    t.clock.advance(2);
    await startTrial(t, fx.productId, email, new TestDevice());
    expect(mailsTo(t, email)).toBe(2);
    // Each delivery takes 100+ ms (a new SMTP connection per mail): wait for both, then settle so
    // that a third would have arrived too.
    await smtp.waitForMail(email);
    await smtp.waitForMail(email);
    await settle();
    expect(delivered(email)).toBe(2);
  });

  test("three codes per hour and five per day for one product", async () => {
    const email = freshEmail();
    const send = async () => {
      await startTrial(t, fx.productId, email, new TestDevice());
      t.clock.advance(121);
    };
    for (let i = 0; i < 4; i++) await send();
    expect(mailsTo(t, email)).toBe(3);
    t.clock.advance(3_600);
    for (let i = 0; i < 4; i++) await send();
    expect(mailsTo(t, email)).toBe(5);
    t.clock.advance(3_600);
    await send();
    expect(mailsTo(t, email)).toBe(5);
    t.clock.advance(DAY);
    await send();
    expect(mailsTo(t, email)).toBe(6);
  });

  test("ten codes per day across products", async () => {
    const email = freshEmail();
    const others = [await trialFixture(t), await trialFixture(t), await trialFixture(t)];
    const products = [fx.productId, ...others.map((o) => o.productId)];
    for (const productId of products) {
      for (let i = 0; i < 3; i++) {
        await startTrial(t, productId, email, new TestDevice());
        t.clock.advance(121);
      }
    }
    expect(mailsTo(t, email)).toBe(10);
    t.clock.advance(3_600);
    await startTrial(t, fx.productId, email, new TestDevice());
    expect(mailsTo(t, email)).toBe(10);
  });

  test("twenty parallel starts for one address send exactly one code", async () => {
    const email = freshEmail();
    const responses = await Promise.all(
      Array.from({ length: 20 }, () => startTrial(t, fx.productId, email, new TestDevice())),
    );
    expect(responses.every((r) => r.status === 202)).toBe(true);
    expect(new Set(responses.map((r) => r.body.data.verification_id)).size).toBe(20);
    expect(mailsTo(t, email)).toBe(1);
    await smtp.waitForMail(email);
    await settle();
    expect(delivered(email)).toBe(1);
  });

  test("parallel starts across products never pass ten codes a day for one address", async () => {
    const email = freshEmail();
    const products = [fx.productId];
    for (let i = 0; i < 5; i++) products.push((await trialFixture(t)).productId);
    for (let round = 0; round < 3; round++) {
      await Promise.all(
        products.flatMap((productId) =>
          Array.from({ length: 3 }, () => startTrial(t, productId, email, new TestDevice())),
        ),
      );
      t.clock.advance(121);
    }
    expect(mailsTo(t, email)).toBe(3);
    t.clock.advance(3_600);
    for (let round = 0; round < 12; round++) {
      await Promise.all(products.map((productId) => startTrial(t, productId, email, new TestDevice())));
      t.clock.advance(121);
    }
    expect(mailsTo(t, email)).toBe(10);
  });
});

describe("daily_limit", () => {
  test("a full 24 hours stops starts and new trials; a device joining a running trial still gets in; then it reopens", async () => {
    await t.call("PATCH", `/mgmt/v1/products/${fx.productId}/trial-signup`, { body: { daily_limit: 1 } });
    const a = freshEmail("a");
    const b = freshEmail("b");
    const [deviceA, deviceA2, deviceB] = [new TestDevice(), new TestDevice(), new TestDevice()];
    const startA = await startTrial(t, fx.productId, a, deviceA);
    const startB = await startTrial(t, fx.productId, b, deviceB);
    t.clock.advance(121);
    const startA2 = await startTrial(t, fx.productId, a, deviceA2);
    const codeA = await smtp.waitForCode(a);
    const codeB = await smtp.waitForCode(b);
    const codeA2 = await smtp.waitForCode(a);
    const confirm = (started: typeof startA, device: TestDevice, code: string, email: string) =>
      confirmTrial(t, started.body.data.verification_id, trialConfirmBody(t, device, { code, email }));

    const first = await confirm(startA, deviceA, codeA, a);
    expect(first.status).toBe(201);
    const second = await confirm(startB, deviceB, codeB, b);
    expect(second.status).toBe(403);
    expect(second.body.error).toMatchObject({
      code: "TRIAL_ACTIVATION_INVALID",
      details: { reason: "limit_reached" },
    });
    const joined = await confirm(startA2, deviceA2, codeA2, a);
    expect(joined.status).toBe(201);
    expect(joined.body.data.license_id).toBe(first.body.data.license_id);

    const c = freshEmail("c");
    await startTrial(t, fx.productId, c, new TestDevice());
    expect(mailsTo(t, c)).toBe(0);
    const signup = await t.call("GET", `/mgmt/v1/products/${fx.productId}/trial-signup`);
    expect(signup.body.data).toMatchObject({ status: "limit_reached", started_last_24_hours: 1 });

    t.clock.advance(DAY);
    const later = await signUp(t, smtp, fx.productId, b, deviceB);
    expect(later.response.status).toBe(201);
  });
});

describe("reuse window", () => {
  test("an address or device gets one trial per product in 365 days, another product is separate", async () => {
    const email = freshEmail();
    const device = new TestDevice();
    const first = await signUp(t, smtp, fx.productId, email, device);
    expect(first.response.status).toBe(201);
    // The 14-day trial has ended: nothing to join, and the window is still open.
    t.clock.advance(15 * DAY);
    const sameAddress = await signUp(t, smtp, fx.productId, email, new TestDevice());
    expect(sameAddress.response.status).toBe(403);
    expect(sameAddress.response.body.error.code).toBe("TRIAL_ALREADY_USED");
    const sameDevice = await signUp(t, smtp, fx.productId, freshEmail(), device);
    expect(sameDevice.response.status).toBe(403);
    expect(sameDevice.response.body.error.code).toBe("TRIAL_ALREADY_USED");

    const other = await trialFixture(t);
    expect((await signUp(t, smtp, other.productId, freshEmail(), device)).response.status).toBe(201);

    t.clock.advance(350 * DAY - 200);
    const early = await signUp(t, smtp, fx.productId, email, new TestDevice());
    expect(early.response.body.error.code).toBe("TRIAL_ALREADY_USED");
    t.clock.advance(201);
    const again = await signUp(t, smtp, fx.productId, email, device);
    expect(again.response.status).toBe(201);
    expect(again.response.body.data.license_id).not.toBe(first.response.body.data.license_id);
  });

  test("a revoked trial is not joined: the address has used its trial", async () => {
    const email = freshEmail();
    const first = await signUp(t, smtp, fx.productId, email, new TestDevice());
    await t.call("DELETE", `/mgmt/v1/licenses/${first.response.body.data.license_id}`);
    t.clock.advance(121);
    const again = await signUp(t, smtp, fx.productId, email, new TestDevice());
    expect(again.response.status).toBe(403);
    expect(again.response.body.error.code).toBe("TRIAL_ALREADY_USED");
  });
});

describe("workspace allowance and environments", () => {
  /** Fills the live trial allowance with licenses written straight into the store. */
  function fillTrialAllowance(limit: number) {
    const now = t.clock.now().getTime();
    t.deps.sqlite
      .query(
        `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
         INSERT INTO licenses (id, environment, product_id, policy_id, key_ciphertext, key_lookup, license_type,
           status, renewal_authority, entitlements, metadata, version, created_at, updated_at)
         SELECT 'lic_fill' || i, 'live', ?, ?, 'x', 'fill' || i, 'trial', 'active', 'vendor', '{}', '{}', 1, ?, ?
         FROM n`,
      )
      .run(limit, fx.productId, fx.trialPolicyId, now, now);
  }

  test("a full live trial allowance is 409 PLAN_QUOTA_EXCEEDED; test trials do not count", async () => {
    t.workspace.setPlan("business");
    const limit = t.workspace.plan().quotas.trial_licenses?.limit ?? 0;
    fillTrialAllowance(limit);
    const live = await signUp(t, smtp, fx.productId, freshEmail(), new TestDevice());
    expect(live.response.status).toBe(409);
    expect(live.response.body.error).toMatchObject({
      code: "PLAN_QUOTA_EXCEEDED",
      details: { quota: "trial_licenses", limit },
    });

    const testFx = await trialFixture(t, { environment: "test" });
    const testTrial = await signUp(t, smtp, testFx.productId, freshEmail(), new TestDevice());
    expect(testTrial.response.status).toBe(201);
    const licenseId = testTrial.response.body.data.license_id;
    expect((await t.call("GET", `/mgmt/v1/licenses/${licenseId}`, { key: t.keys.test })).status).toBe(200);
    expect((await t.call("GET", `/mgmt/v1/licenses/${licenseId}`)).status).toBe(404);
  });

  test("the reuse window of a test product does not touch the live product's", async () => {
    const testFx = await trialFixture(t, { environment: "test" });
    const email = freshEmail();
    const device = new TestDevice();
    expect((await signUp(t, smtp, testFx.productId, email, device)).response.status).toBe(201);
    t.clock.advance(121);
    expect((await signUp(t, smtp, fx.productId, email, device)).response.status).toBe(201);
  });
});
