import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { TestDevice } from "../support/device.ts";
import { type CallResult, createTestContext, type TestContext } from "../support/harness.ts";
import {
  activate,
  activatedDevice,
  heartbeatPath,
  proofCall,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";
import {
  confirmTrial,
  freshEmail,
  signUp,
  startTrial,
  trialConfirmBody,
  trialFixture,
} from "../support/trials.ts";

/**
 * The monthly Runtime API allowance (spec §4.2 rules 1, 10, 12; §8): which answers count, the
 * refusal once the allowance with its overage is used up, and the reset when the month turns.
 * On the free plan: 100,000 requests plus 10,000 overage.
 */
let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
  t.workspace.setPlan("free");
});
afterEach(() => t.close());

const CEILING = 110_000;
const DIGEST = machineInfoDigest({ os: "linux", arch: "x64" });
const used = async (): Promise<number> =>
  (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas.runtime_requests.used;
const month = () => t.clock.now().toISOString().slice(0, 7);
/**
 * Moves to the start of next month and sets that month's counter as if the meter had flushed it
 * (the meter reads a month's stored count once, when it first meets the month).
 */
const seedNextMonth = (count: number) => {
  toNextMonth();
  seed(count);
};
/** A minute into next month, so a test that moves the clock by hours stays in one month. */
const toNextMonth = () => {
  const now = t.clock.now();
  t.clock.advance((Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1) - now.getTime()) / 1000 + 60);
};
const seed = (count: number) =>
  t.deps.sqlite.run(
    `INSERT INTO usage_counters (metric, period, count) VALUES ('runtime_requests', ?, ?)
     ON CONFLICT (metric, period) DO UPDATE SET count = excluded.count`,
    [month(), count],
  );
const time = () =>
  t.call("POST", "/runtime/v1/time", {
    key: null,
    body: { product_id: fx.productId, nonce: "a-time-nonce-of-enough-length" },
  });
const beat = (device: TestDevice, activationId: string) =>
  proofCall(t, device, "POST", heartbeatPath(activationId), activationId, { machine_info_digest: DIGEST });

/**
 * Runtime operations that answer 404 NOT_FOUND from their route (spec §4.2: every answered
 * request counts), set up beforehand so that calling them makes no other request.
 */
async function routedNotFounds(): Promise<(() => Promise<CallResult>)[]> {
  const unknownProduct = "prd_doesnotexist0000000000";
  const unknownActivation = "act_doesnotexist00000000000";
  const d = await activatedDevice(t, fx);
  const other = await activatedDevice(t, fx);
  // Another device's lease does not exist for this device.
  const lease = await proofCall(t, other.device, "POST", "/runtime/v1/leases", other.activationId, {
    activation_id: other.activationId,
    instance_id: "instance-1",
  });
  expect(lease.status).toBe(201);
  const leasePath = `/runtime/v1/leases/${lease.body.data.lease_id}`;
  return [
    () =>
      t.call("POST", "/runtime/v1/time", {
        key: null,
        body: { product_id: unknownProduct, nonce: "a-time-nonce-of-enough-length" },
      }),
    () => t.call("GET", `/runtime/v1/products/${unknownProduct}/trust-bundle`, { key: null }),
    () => activate(t, new TestDevice(), { licenseKey: fx.licenseKey, productId: unknownProduct }),
    () =>
      proofCall(t, d.device, "POST", heartbeatPath(unknownActivation), unknownActivation, {
        machine_info_digest: DIGEST,
      }),
    () => proofCall(t, d.device, "DELETE", `/runtime/v1/activations/${unknownActivation}`, unknownActivation),
    () =>
      proofCall(t, d.device, "POST", `${leasePath}/heartbeat`, d.activationId, { instance_id: "instance-1" }),
    () => proofCall(t, d.device, "DELETE", leasePath, d.activationId, { instance_id: "instance-1" }),
  ];
}

describe("counting", () => {
  test("the plan report shows the allowance: limit, overage, used, remaining and the reset", async () => {
    const quota = (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas.runtime_requests;
    const now = t.clock.now();
    // The fixture fetched the trust bundle once.
    expect(quota).toEqual({
      limit: 100_000,
      used: 1,
      remaining: 99_999,
      limit_with_overage: CEILING,
      resets_at: new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1)).toISOString(),
    });
  });

  test("time, trust bundle, activation, check-in, deactivation and denied calls each count once", async () => {
    const before = await used();
    expect((await time()).status).toBe(200);
    expect(
      (await t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, { key: null })).status,
    ).toBe(200);
    const { device, activationId } = await activatedDevice(t, fx);
    expect((await beat(device, activationId)).status).toBe(200);
    // A refusal other than revoked or expired still used the service.
    expect((await beat(new TestDevice(), activationId)).body.error.code).toBe("DEVICE_PROOF_INVALID");
    const gone = await proofCall(
      t,
      device,
      "DELETE",
      `/runtime/v1/activations/${activationId}`,
      activationId,
    );
    expect(gone.status).toBe(200);
    expect((await used()) - before).toBe(6);
  });

  test("revoked and expired denials do not count toward the month", async () => {
    // Two hours later must be the same month whatever the time of day the suite runs.
    toNextMonth();
    const { device, activationId } = await activatedDevice(t, fx);
    const expiring = await runtimeFixture(t, {
      license: { expires_at: new Date(t.clock.now().getTime() + 3_600_000).toISOString() },
    });
    const other = await activatedDevice(t, expiring);
    const before = await used();
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    t.clock.advance(7_200);
    expect((await beat(device, activationId)).body.error.code).toBe("LICENSE_REVOKED");
    expect((await beat(other.device, other.activationId)).body.error.code).toBe("LICENSE_EXPIRED");
    expect((await beat(device, activationId)).body.error.code).toBe("LICENSE_REVOKED");
    expect(await used()).toBe(before);
  });

  test("CORS preflights are never counted", async () => {
    const before = await used();
    for (const path of [
      "/runtime/v1/time",
      "/runtime/v1/activations",
      `/runtime/v1/activations/act_x/heartbeat`,
    ]) {
      await t.call("OPTIONS", path, {
        key: null,
        headers: { origin: "https://app.example.com", "access-control-request-method": "POST" },
      });
    }
    expect(await used()).toBe(before);
  });

  test("an unknown runtime path is not an operation and is not counted", async () => {
    const before = await used();
    expect((await t.call("POST", "/runtime/v1/nothing-here", { key: null, body: {} })).status).toBe(404);
    expect(await used()).toBe(before);
  });

  test("a routed operation's 404 (an unknown product, activation or lease) counts once, while an unknown path does not", async () => {
    const calls = await routedNotFounds();
    for (const call of calls) {
      const before = await used();
      const answer = await call();
      expect(answer.status).toBe(404);
      expect(answer.body.error.code).toBe("NOT_FOUND");
      expect((await used()) - before).toBe(1);
    }
    const before = await used();
    expect((await t.call("POST", "/runtime/v1/nothing-here", { key: null, body: {} })).status).toBe(404);
    expect(await used()).toBe(before);
  });

  test("calls for a test product count toward the workspace's one monthly allowance, as live ones do", async () => {
    const testFx = await runtimeFixture(t, { key: t.keys.test });
    const before = await used();
    const answer = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: testFx.productId, nonce: "a-time-nonce-of-enough-length" },
    });
    expect(answer.status).toBe(200);
    expect(await used()).toBe(before + 1);
    // The test key's plan report shows the same figure.
    const asTest = await t.call("GET", "/mgmt/v1/plan", { key: t.keys.test });
    expect(asTest.body.data.quotas.runtime_requests.used).toBe(before + 1);
  });

  test("counting writes to the store in batches, not once per request", async () => {
    expect((await time()).status).toBe(200);
    const stored = () =>
      t.deps.sqlite
        .query<{ count: number }, [string]>(
          "SELECT count FROM usage_counters WHERE metric = 'runtime_requests' AND period = ?",
        )
        .get(month())?.count ?? 0;
    const flushed = stored();
    const counted = await used();
    for (let i = 0; i < 10; i++) await time();
    expect(stored()).toBe(flushed);
    expect(await used()).toBe(counted + 10);
  });
});

describe("the allowance used up", () => {
  test("past the allowance with overage, runtime calls answer 429 with the quota until the month turns", async () => {
    seedNextMonth(CEILING - 3);
    // Retry-After counts whole seconds to the month's end: the clock must not cross a second
    // between the refusal and the expectation computed from it.
    t.clock.freeze();
    const { device, activationId } = await activatedDevice(t, fx);
    expect((await time()).status).toBe(200);
    expect((await beat(device, activationId)).status).toBe(200);
    for (const refused of [await time(), await beat(device, activationId)]) {
      expect(refused.status).toBe(429);
      const now = t.clock.now();
      const resetsAt = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1));
      expect(refused.body.error).toMatchObject({
        code: "RATE_LIMITED",
        retryable: true,
        details: {
          quota: "runtime_requests",
          limit: 100_000,
          limit_with_overage: CEILING,
          resets_at: resetsAt.toISOString(),
        },
      });
      expect(Number(refused.headers.get("retry-after"))).toBe(
        Math.ceil((resetsAt.getTime() - now.getTime()) / 1000),
      );
    }
    const report = (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas.runtime_requests;
    expect(report).toMatchObject({ used: CEILING, remaining: 0 });
    // Refusals are not counted, and the Management API is a separate allowance.
    expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
    // Across the month boundary the allowance starts again.
    const retryAfter = Number((await time()).headers.get("retry-after"));
    t.clock.advance(retryAfter);
    expect((await time()).status).toBe(200);
    // A month later the device sends its full machine_info again (its baseline is over 24 hours old).
    const full = await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
      machine_info: { os: "linux", arch: "x64" },
    });
    expect(full.status).toBe(200);
    expect(await used()).toBe(2);
  });

  /** Answers by status and, for refusals, by what refused them. */
  const tally = (answers: CallResult[]) => {
    const counts: Record<string, number> = {};
    for (const answer of answers) {
      const details = answer.body.error?.details;
      const key = answer.status === 429 ? `429 ${details.quota ?? details.policy}` : String(answer.status);
      counts[key] = (counts[key] ?? 0) + 1;
    }
    return counts;
  };

  test("check-ins sent at once with five calls left: five are answered and the rest refused, and the month stops at the ceiling", async () => {
    seedNextMonth(CEILING - 6);
    const { device, activationId } = await activatedDevice(t, fx);
    const answers = await Promise.all(Array.from({ length: 20 }, () => beat(device, activationId)));
    expect(tally(answers)).toEqual({ "200": 5, "429 runtime_requests": 15 });
    expect(await used()).toBe(CEILING);
    expect((await time()).status).toBe(429);
  });

  test("activations sent at once with three calls left: three are created and the rest refused", async () => {
    seedNextMonth(CEILING - 3);
    const answers = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        t.call("POST", "/runtime/v1/activations", {
          key: null,
          body: new TestDevice().activationBody({
            licenseKey: fx.licenseKey,
            productId: fx.productId,
            clientTime: Math.floor(t.clock.now().getTime() / 1000),
          }),
          headers: { "idempotency-key": `quota-burst-${String(i).padStart(4, "0")}` },
        }),
      ),
    );
    expect(tally(answers)).toEqual({ "201": 3, "429 runtime_requests": 7 });
    expect(await used()).toBe(CEILING);
    const listed = await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}/activations`);
    expect(listed.body.data).toHaveLength(3);
  });

  test("calls in flight count as used until answered; one whose answer does not count gives its place back", async () => {
    seedNextMonth(CEILING - 2);
    const { device, activationId } = await activatedDevice(t, fx);
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    const answers = await Promise.all(Array.from({ length: 5 }, () => beat(device, activationId)));
    // Only one place was left, and the first took it while in flight.
    expect(tally(answers)).toEqual({ "403": 1, "429 runtime_requests": 4 });
    expect(answers.find((a) => a.status === 403)?.body.error.code).toBe("LICENSE_REVOKED");
    expect((await time()).status).toBe(200);
    expect(await used()).toBe(CEILING);
  });

  test("requests to runtime paths no route serves give their place back: with two calls left, unknown paths leave both", async () => {
    seedNextMonth(CEILING - 2);
    for (const path of [
      "/runtime/v1/nothing-here",
      "/runtime/v1/activations/act_unknown",
      "/runtime/v1/time/x",
    ]) {
      for (let i = 0; i < 5; i++)
        expect((await t.call("GET", `${path}${i}`, { key: null })).status).toBe(404);
    }
    expect([(await time()).status, (await time()).status, (await time()).status]).toEqual([200, 200, 429]);
    expect(await used()).toBe(CEILING);
  });

  test("routed 404 answers give their place back once counted: with as many calls left, each is answered and the next call is refused", async () => {
    const calls = await routedNotFounds();
    seedNextMonth(CEILING - calls.length);
    for (const call of calls) expect((await call()).status).toBe(404);
    expect((await time()).status).toBe(429);
    expect(await used()).toBe(CEILING);
  });

  test("a new activation is refused too, and nothing is created", async () => {
    seedNextMonth(CEILING);
    const device = new TestDevice();
    const refused = await t.call("POST", "/runtime/v1/activations", {
      key: null,
      body: device.activationBody({
        licenseKey: fx.licenseKey,
        productId: fx.productId,
        clientTime: Math.floor(t.clock.now().getTime() / 1000),
      }),
      headers: { "idempotency-key": "quota-activation-0001" },
    });
    expect(refused.status).toBe(429);
    const listed = await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}/activations`);
    expect(listed.body.data).toEqual([]);
  });
});

describe("verification calls", () => {
  let smtp: TestSmtpServer;
  let stopMail: () => Promise<void>;
  beforeAll(async () => {
    smtp = await startSmtpServer();
  });
  afterAll(() => smtp.stop());

  test("trial start does not count; trial confirm counts once, as its activation; replays and failures do not", async () => {
    stopMail = deliverMail(t.deps, smtp.url);
    try {
      t.workspace.setPlan("business");
      const trial = await trialFixture(t);
      const before = await used();
      const device = new TestDevice();
      const email = freshEmail();
      const { response } = await signUp(t, smtp, trial.productId, email, device);
      expect(response.status).toBe(201);
      expect((await used()) - before).toBe(1);

      // The same confirm again (same Idempotency-Key and body) is the first answer replayed.
      const other = new TestDevice();
      const otherEmail = freshEmail();
      const started = await startTrial(t, trial.productId, otherEmail, other);
      expect(started.status).toBe(202);
      const otherCode = await smtp.waitForCode(otherEmail);
      const wrong = trialConfirmBody(t, other, {
        code: otherCode === "000000" ? "111111" : "000000",
        email: otherEmail,
      });
      expect((await confirmTrial(t, started.body.data.verification_id, wrong)).status).toBe(401);
      const body = trialConfirmBody(t, other, { code: otherCode, email: otherEmail });
      const first = await confirmTrial(
        t,
        started.body.data.verification_id,
        body,
        "trial-confirm-quota-0001",
      );
      expect(first.status).toBe(201);
      const replay = await confirmTrial(
        t,
        started.body.data.verification_id,
        body,
        "trial-confirm-quota-0001",
      );
      expect(replay.headers.get("idempotent-replayed")).toBe("true");
      expect((await used()) - before).toBe(2);
    } finally {
      await stopMail();
    }
  });

  test("email verification start and confirm never count, and still answer when the allowance is used up", async () => {
    seedNextMonth(CEILING);
    const before = await used();
    const device = new TestDevice();
    const start = await t.call("POST", "/runtime/v1/email-verifications", {
      key: null,
      body: {
        product_id: fx.productId,
        license_key: fx.licenseKey,
        email: "nobody@example.com",
        device_signing_public_key: device.signingPublic,
        nonce: "an-email-nonce-of-enough-length",
        locale: "en",
        sdk_version: "test",
      },
    });
    expect(start.status).not.toBe(429);
    const confirm = await t.call(
      "POST",
      "/runtime/v1/email-verifications/ver_00000000000000000000000000/confirm",
      {
        key: null,
        body: {
          code: "123456",
          device_signing_public_key: device.signingPublic,
          nonce: "an-email-nonce-of-enough-length-2",
          sdk_version: "test",
        },
      },
    );
    expect(confirm.status).not.toBe(429);
    const trialStart = await startTrial(t, fx.productId, freshEmail(), device);
    expect(trialStart.status).not.toBe(429);
    expect(await used()).toBe(before);
  });
});
