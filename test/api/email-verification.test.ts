import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { eq } from "drizzle-orm";
import { parseSealingKeyLine, sealFile } from "../../src/crypto/sealed-file.ts";
import { mailOutbox } from "../../src/store/schema/index.ts";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import {
  confirmVerification,
  type NamedUserFixture,
  namedUserFixture,
  startedWithMailedCode,
  startVerification,
} from "../support/named-users.ts";
import { activate, heartbeatPath, proofCall } from "../support/runtime.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";

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

async function tokenFor(who = device, extra: Record<string, unknown> = {}) {
  const { id, code } = await started(f.email, who);
  const confirmed = await confirmVerification(t, who, id, code, extra);
  expect(confirmed.status).toBe(200);
  return confirmed.body.data.named_user_token as string;
}

const BEAT = { machine_info: { os: "linux", arch: "x64" } };
const beat = (who: TestDevice, id: string) => proofCall(t, who, "POST", heartbeatPath(id), id, BEAT);
const near = (iso: string, expectedMs: number) =>
  expect(Math.abs(new Date(iso).getTime() - expectedMs)).toBeLessThan(2_000);

const wrongCode = (code: string) => String((Number(code) + 1) % 1_000_000).padStart(6, "0");
const settle = () => Bun.sleep(120);

test("a verification's id cannot be guessed from the request ids around it: its random part is fresh", async () => {
  // With the clock held still every id here is made in one millisecond, where a monotonic id is
  // the previous one plus one: the worst case for a guesser watching X-Request-Id.
  t.clock.freeze();
  const randomPart = (id: string) => id.slice(id.indexOf("_") + 11);
  const before = await t.call("GET", "/mgmt/v1/products");
  const response = await startVerification(t, device, f, f.email);
  const after = await t.call("GET", "/mgmt/v1/products");
  expect(response.status).toBe(202);
  const verification = randomPart(response.body.data.verification_id);
  const bracket = [before, response, after].map((r) => randomPart(r.headers.get("x-request-id") ?? ""));
  // Between the request ids before and after it lies every id the counter made meanwhile.
  const [low, , high] = bracket as [string, string, string];
  expect(low < high).toBe(true);
  expect(verification > low && verification < high).toBe(false);
});

describe("the whole named-user flow", () => {
  test("start, code from the mail, confirm, token, activation, heartbeat", async () => {
    const { id, code, response } = await started();
    expect(response.body.data).toMatchObject({ verification_id: id, resend_after_sec: 120, code_length: 6 });
    near(response.body.data.expires_at, t.clock.now().getTime() + 600_000);
    expect(response.body.response_assertion.status).toBe(202);
    expect(response.body.response_assertion.product_id).toBe(f.productId);
    const confirmed = await confirmVerification(t, device, id, code);
    expect(confirmed.status).toBe(200);
    expect(confirmed.body.data.named_user_token).toStartWith("nut_");
    near(confirmed.body.data.expires_at, t.clock.now().getTime() + 300_000);
    expect(confirmed.body.response_assertion.status).toBe(200);
    const activation = await activate(t, device, f, {
      body: { named_user_token: confirmed.body.data.named_user_token },
    });
    expect(activation.status).toBe(201);
    expect((await beat(device, activation.body.data.activation_id)).status).toBe(200);
  });

  test("a named-user license refuses activation without a token, with a used one, another device's, another license's or an expired one", async () => {
    expect((await activate(t, device, f)).body.error.code).toBe("NAMED_USER_TOKEN_INVALID");
    const token = await tokenFor();
    expect((await activate(t, device, f, { body: { named_user_token: `${token}x` } })).status).toBe(401);
    const other = new TestDevice();
    expect((await activate(t, other, f, { body: { named_user_token: token } })).body.error.code).toBe(
      "NAMED_USER_TOKEN_INVALID",
    );
    expect((await activate(t, device, f, { body: { named_user_token: token } })).status).toBe(201);
    // Single use: the same device cannot spend it again.
    expect((await activate(t, device, f, { body: { named_user_token: token } })).body.error.code).toBe(
      "NAMED_USER_TOKEN_INVALID",
    );
    const late = await tokenFor();
    t.clock.advance(301);
    expect((await activate(t, device, f, { body: { named_user_token: late } })).body.error.code).toBe(
      "NAMED_USER_TOKEN_INVALID",
    );
  });

  test("a refused activation (machine limit) leaves the token unspent", async () => {
    const g = await namedUserFixture(t, { policy: { max_machines: 1 } });
    f = g;
    const first = new TestDevice();
    expect((await activate(t, first, f, { body: { named_user_token: await tokenFor(first) } })).status).toBe(
      201,
    );
    const second = new TestDevice();
    const token = await tokenFor(second);
    expect((await activate(t, second, f, { body: { named_user_token: token } })).body.error.code).toBe(
      "MACHINE_LIMIT_REACHED",
    );
    await t.call(
      "DELETE",
      `/mgmt/v1/activations/${(await t.call("GET", `/mgmt/v1/licenses/${f.licenseId}/activations`)).body.data[0].id}`,
    );
    expect((await activate(t, second, f, { body: { named_user_token: token } })).status).toBe(201);
  });
  test("a replay of an activation that succeeded returns the stored answer without looking at a token, and spends none", async () => {
    const idempotencyKey = "named-user-activation-retried-01";
    const first = await activate(t, device, f, {
      body: { named_user_token: await tokenFor() },
      idempotencyKey,
    });
    expect(first.status).toBe(201);
    // A retry after a lost answer: the first request spent its token, and no new one is needed.
    const fresh = await tokenFor();
    for (const body of [{}, { named_user_token: "nut_garbage" }, { named_user_token: fresh }]) {
      const replay = await activate(t, device, f, { body, idempotencyKey });
      expect([replay.status, replay.headers.get("idempotent-replayed")]).toEqual([201, "true"]);
      expect(replay.body.data.activation_id).toBe(first.body.data.activation_id);
    }
    expect((await activate(t, device, f)).body.error.code).toBe("NAMED_USER_TOKEN_INVALID");
    expect((await activate(t, device, f, { body: { named_user_token: fresh } })).status).toBe(201);
  });
});

describe("rule 6: a code only when everything holds, the same 202 either way", () => {
  test("an address typed in another case matches, and the mail goes to the address as stored", async () => {
    const response = await startVerification(t, device, f, f.email.toUpperCase());
    expect(response.status).toBe(202);
    const mail = await smtp.waitForMail(f.email);
    expect(mail.raw).toContain(`To: ${f.email}`);
    expect(mail.raw).not.toContain(f.email.toUpperCase());
    expect(
      (await confirmVerification(t, device, response.body.data.verification_id, mail.code ?? "")).status,
    ).toBe(200);
  });

  test("an address with no user gets the same 202 and no mail, only a suppressed outbox row", async () => {
    const response = await startVerification(t, device, f, "nobody@example.com");
    expect(response.status).toBe(202);
    expect(Object.keys(response.body.data).sort()).toEqual([
      "code_length",
      "expires_at",
      "resend_after_sec",
      "verification_id",
    ]);
    await settle();
    expect(smtp.messages).toHaveLength(0);
    const rows = t.deps.db
      .select()
      .from(mailOutbox)
      .where(eq(mailOutbox.recipient, "nobody@example.com"))
      .all();
    // Written as large as a sent one (same encrypted payload), so its cost does not tell them apart.
    expect(rows.map((r) => r.status)).toEqual(["suppressed"]);
    expect(rows[0]?.payload).toStartWith("v1.");
    // Confirming it behaves like a wrong code, whatever is sent.
    const confirm = await confirmVerification(t, device, response.body.data.verification_id, "000000");
    expect(confirm.status).toBe(401);
    expect(confirm.body.error.code).toBe("EMAIL_VERIFICATION_CODE_INVALID");
    expect(confirm.body.error.details.remaining_attempts).toBe(4);
  });

  test("no code for an unassigned user, a disabled user, a wrong license key, a suspended license or a device policy", async () => {
    const cases: [string, () => Promise<string>][] = [
      [
        "unassigned",
        async () => {
          await t.call("DELETE", `/mgmt/v1/license-assignments/${f.assignmentId}`);
          return f.email;
        },
      ],
      [
        "disabled",
        async () => {
          await t.call("DELETE", `/mgmt/v1/license-users/${f.userId}`);
          return f.email;
        },
      ],
      [
        "suspended",
        async () => {
          const license = await t.call("GET", `/mgmt/v1/licenses/${f.licenseId}`);
          await t.call("PATCH", `/mgmt/v1/licenses/${f.licenseId}`, {
            body: { status_action: "suspended" },
            headers: { "if-match": String(license.body.data.version) },
          });
          return f.email;
        },
      ],
    ];
    for (const [, prepare] of cases) {
      f = await namedUserFixture(t);
      const email = await prepare();
      expect((await startVerification(t, device, f, email)).status).toBe(202);
    }
    f = await namedUserFixture(t);
    expect(
      (await startVerification(t, device, { ...f, licenseKey: "AAAAA-BBBBB-CCCCC-DDDDD" }, f.email)).status,
    ).toBe(202);
    const deviceFixture = await namedUserFixture(t);
    await t.call("PATCH", `/mgmt/v1/policies/${deviceFixture.policyId}`, {
      body: { identity_mode: "device" },
    });
    expect((await startVerification(t, device, deviceFixture, deviceFixture.email)).status).toBe(202);
    await settle();
    expect(smtp.messages).toHaveLength(0);
  });

  test("a plan without email license verification refuses the start and the confirm with 403", async () => {
    const { id, code } = await started();
    t.workspace.setPlan("free");
    const start = await startVerification(t, device, f, f.email);
    expect(start.status).toBe(403);
    expect(start.body.error.code).toBe("PLAN_ENTITLEMENT_REQUIRED");
    expect(start.body.error.details.entitlement).toBe("email_license_verification");
    expect((await confirmVerification(t, device, id, code)).body.error.code).toBe(
      "PLAN_ENTITLEMENT_REQUIRED",
    );
  });

  test("an unknown product is 404 and a malformed device key 422", async () => {
    expect((await startVerification(t, device, { ...f, productId: "prod_nope" }, f.email)).status).toBe(404);
    const bad = await startVerification(t, device, f, f.email, { device_signing_public_key: "ed25519:AAAA" });
    expect(bad.status).toBe(422);
  });
});

describe("confirm errors", () => {
  test("five wrong codes count down remaining_attempts, then even the right code is 410", async () => {
    const { id, code } = await started();
    for (let left = 4; left >= 0; left--) {
      const response = await confirmVerification(t, device, id, wrongCode(code));
      expect(response.status).toBe(401);
      expect(response.body.error.details.remaining_attempts).toBe(left);
    }
    const last = await confirmVerification(t, device, id, code);
    expect(last.status).toBe(410);
    expect(last.body.error.code).toBe("EMAIL_VERIFICATION_EXPIRED");
  });

  test("the right code from another device key is a wrong attempt", async () => {
    const { id, code } = await started();
    const response = await confirmVerification(t, new TestDevice(), id, code);
    expect(response.status).toBe(401);
    expect(response.body.error.code).toBe("EMAIL_VERIFICATION_CODE_INVALID");
    expect(response.body.error.details.remaining_attempts).toBe(4);
    expect((await confirmVerification(t, device, id, code)).status).toBe(200);
  });

  test("a code is single use, lasts 10 minutes, and is replaced by a newer start", async () => {
    const used = await started();
    expect((await confirmVerification(t, device, used.id, used.code)).status).toBe(200);
    expect((await confirmVerification(t, device, used.id, used.code)).status).toBe(410);

    const late = await started();
    t.clock.advance(600);
    expect((await confirmVerification(t, device, late.id, late.code)).body.error.code).toBe(
      "EMAIL_VERIFICATION_EXPIRED",
    );

    const older = await started();
    const newer = await started();
    expect((await confirmVerification(t, device, older.id, older.code)).status).toBe(410);
    expect((await confirmVerification(t, device, newer.id, newer.code)).status).toBe(200);
  });

  test("an unknown verification id is 410 and a malformed code 422", async () => {
    expect((await confirmVerification(t, device, "ver_01ARZ3NDEKTSV4RRFFQ69G5FAV", "123456")).status).toBe(
      410,
    );
    const { id } = await started();
    expect((await confirmVerification(t, device, id, "12345")).status).toBe(422);
    expect((await confirmVerification(t, device, id, "12345a")).status).toBe(422);
  });

  test("an assignment removed (or user disabled) after the start is 403 NAMED_USER_ASSIGNMENT_UNAVAILABLE", async () => {
    const { id, code } = await started();
    await t.call("DELETE", `/mgmt/v1/license-assignments/${f.assignmentId}`);
    const response = await confirmVerification(t, device, id, code);
    expect(response.status).toBe(403);
    expect(response.body.error.code).toBe("NAMED_USER_ASSIGNMENT_UNAVAILABLE");

    f = await namedUserFixture(t);
    const second = await started();
    await t.call("DELETE", `/mgmt/v1/license-users/${f.userId}`);
    expect((await confirmVerification(t, device, second.id, second.code)).body.error.code).toBe(
      "NAMED_USER_ASSIGNMENT_UNAVAILABLE",
    );
  });

  test("a user whose address the vendor changed after the start is 403 NAMED_USER_ASSIGNMENT_UNAVAILABLE; a case-only change is the same address", async () => {
    const changeEmail = async (email: string) => {
      const got = await t.call("GET", `/mgmt/v1/license-users/${f.userId}`);
      const patched = await t.call("PATCH", `/mgmt/v1/license-users/${f.userId}`, {
        body: { email },
        headers: { "if-match": got.headers.get("etag") ?? "" },
      });
      expect(patched.status).toBe(200);
    };
    const sameAddress = await started();
    await changeEmail(f.email.toUpperCase());
    expect((await confirmVerification(t, device, sameAddress.id, sameAddress.code)).status).toBe(200);

    const { id, code } = await started();
    // The code went to the old mailbox: one lost or taken over is why a vendor changes it.
    await changeEmail(`moved.${f.email}`);
    const response = await confirmVerification(t, device, id, code);
    expect(response.status).toBe(403);
    expect(response.body.error.code).toBe("NAMED_USER_ASSIGNMENT_UNAVAILABLE");
  });

  test("a code started under the earlier mailbox key (address with environment) still confirms across the upgrade, unless the address changed", async () => {
    const earlierKey = () =>
      t.deps.sqlite.run("UPDATE email_verifications SET address_hash = ?", [
        t.deps.secrets.lookupHash(`live\0${f.email.toLowerCase()}`, "email-verification-address"),
      ]);
    const across = await started();
    earlierKey();
    expect((await confirmVerification(t, device, across.id, across.code)).status).toBe(200);

    const { id, code } = await started();
    earlierKey();
    await t.call("PATCH", `/mgmt/v1/license-users/${f.userId}`, { body: { email: `moved.${f.email}` } });
    const moved = await confirmVerification(t, device, id, code);
    expect([moved.status, moved.body.error.code]).toEqual([403, "NAMED_USER_ASSIGNMENT_UNAVAILABLE"]);
  });

  test("an assignment removed between confirm and activation refuses the activation", async () => {
    const token = await tokenFor();
    await t.call("DELETE", `/mgmt/v1/license-assignments/${f.assignmentId}`);
    const response = await activate(t, device, f, { body: { named_user_token: token } });
    expect(response.status).toBe(403);
    expect(response.body.error.code).toBe("NAMED_USER_ASSIGNMENT_UNAVAILABLE");
  });
});

describe("rule 1: devices of a named user whose assignment ended", () => {
  test("heartbeats are refused with a signed 403 once the assignment is removed or the user disabled", async () => {
    const token = await tokenFor();
    const activation = await activate(t, device, f, { body: { named_user_token: token } });
    const id = activation.body.data.activation_id as string;
    expect((await beat(device, id)).status).toBe(200);
    await t.call("DELETE", `/mgmt/v1/license-assignments/${f.assignmentId}`);
    const refused = await beat(device, id);
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("NAMED_USER_ASSIGNMENT_UNAVAILABLE");
    expect(refused.body.response_assertion.status).toBe(403);
    expect(refused.body.response_signature).toBeString();

    f = await namedUserFixture(t);
    const other = new TestDevice();
    const second = await activate(t, other, f, { body: { named_user_token: await tokenFor(other) } });
    const secondId = second.body.data.activation_id as string;
    await t.call("DELETE", `/mgmt/v1/license-users/${f.userId}`);
    expect((await beat(other, secondId)).body.error.code).toBe("NAMED_USER_ASSIGNMENT_UNAVAILABLE");
  });

  test("floating seats and activation replays are refused with a signed 403 once the assignment is removed", async () => {
    const token = await tokenFor();
    const idempotencyKey = "named-user-activation-replayed-01";
    const first = await activate(t, device, f, { body: { named_user_token: token }, idempotencyKey });
    const id = first.body.data.activation_id as string;
    const acquire = (instance: string) =>
      proofCall(t, device, "POST", "/runtime/v1/leases", id, { activation_id: id, instance_id: instance });
    const lease = await acquire("a");
    expect(lease.status).toBe(201);
    const leaseId = lease.body.data.lease_id as string;
    await t.call("DELETE", `/mgmt/v1/license-assignments/${f.assignmentId}`);
    const refusals = [
      await proofCall(t, device, "POST", `/runtime/v1/leases/${leaseId}/heartbeat`, id, { instance_id: "a" }),
      await acquire("b"),
      await activate(t, device, f, { body: { named_user_token: token }, idempotencyKey }),
    ];
    expect(refusals.map((r) => [r.status, r.body.error?.code, r.body.response_assertion?.status])).toEqual([
      [403, "NAMED_USER_ASSIGNMENT_UNAVAILABLE", 403],
      [403, "NAMED_USER_ASSIGNMENT_UNAVAILABLE", 403],
      [403, "NAMED_USER_ASSIGNMENT_UNAVAILABLE", 403],
    ]);
    const seats = t.deps.sqlite
      .query<{ n: number }, [string]>("SELECT count(*) AS n FROM leases WHERE activation_id = ?")
      .get(id)?.n;
    expect(seats).toBe(1);
  });

  test("sealed-file keys are refused with a signed 403 once the assignment is removed", async () => {
    const enabled = await t.call("POST", `/mgmt/v1/products/${f.productId}/sealed-files`);
    const dir = mkdtempSync(join(tmpdir(), "named-sealed-"));
    try {
      writeFileSync(join(dir, "in"), "secret payload");
      await sealFile(
        join(dir, "in"),
        join(dir, "out"),
        parseSealingKeyLine(enabled.body.data.current_key.sealing_key),
        {},
      );
      const file = readFileSync(join(dir, "out"));
      const header = file.subarray(9, file.indexOf(0x0a, 9)).toString("utf8");
      const activation = await activate(t, device, f, { body: { named_user_token: await tokenFor() } });
      const id = activation.body.data.activation_id as string;
      const path = `/runtime/v1/activations/${id}/sealed-file-keys`;
      expect((await proofCall(t, device, "POST", path, id, { header })).status).toBe(200);
      await t.call("DELETE", `/mgmt/v1/license-assignments/${f.assignmentId}`);
      const refused = await proofCall(t, device, "POST", path, id, { header });
      expect(refused.status).toBe(403);
      expect(refused.body.error.code).toBe("NAMED_USER_ASSIGNMENT_UNAVAILABLE");
      expect(refused.body.response_signature).toBeString();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("brute force", () => {
  test("twenty parallel wrong guesses: exactly five are judged, the rest are 410, and the right code no longer works", async () => {
    const { id, code } = await started();
    const responses = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        confirmVerification(t, device, id, String((Number(code) + 1 + i) % 1_000_000).padStart(6, "0")),
      ),
    );
    const statuses = responses.map((r) => r.status);
    expect(statuses.filter((s) => s === 401)).toHaveLength(5);
    expect(statuses.filter((s) => s === 410)).toHaveLength(15);
    expect(
      responses
        .filter((r) => r.status === 401)
        .map((r) => r.body.error.details.remaining_attempts)
        .sort(),
    ).toEqual([0, 1, 2, 3, 4]);
    expect((await confirmVerification(t, device, id, code)).status).toBe(410);
  });
});
