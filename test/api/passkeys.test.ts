import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { silentLogger } from "../../src/http/logger.ts";
import { sweepOnce } from "../../src/jobs/sweeper.ts";
import { createServices } from "../../src/services.ts";
import { TestDevice } from "../support/device.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import {
  confirmVerification,
  type NamedUserFixture,
  namedUserFixture,
  startVerification,
} from "../support/named-users.ts";
import { SoftAuthenticator } from "../support/passkey.ts";
import { activate } from "../support/runtime.ts";
import { deliverMail, startSmtpServer, type TestSmtpServer } from "../support/smtp.ts";

let t: TestContext;
let smtp: TestSmtpServer;
let stopMail: () => Promise<void>;
let f: NamedUserFixture;

beforeEach(async () => {
  t = createTestContext();
  smtp = await startSmtpServer();
  stopMail = deliverMail(t.deps, smtp.url);
  f = await namedUserFixture(t);
});
afterEach(async () => {
  await stopMail();
  await smtp.stop();
  t.close();
});

const post = (path: string, body: unknown) => t.call("POST", path, { key: null, body });

async function registrationToken(userId = f.userId): Promise<string> {
  const link = await t.call("POST", `/mgmt/v1/license-users/${userId}/two-factor/passkeys/registration-link`);
  expect(link.status).toBe(201);
  expect(link.body.data.url).toStartWith("http://licensing.test/passkeys/v1/register#");
  return link.body.data.url.split("#")[1];
}

async function register(authenticator: SoftAuthenticator, overrides: Record<string, unknown> = {}) {
  const token = await registrationToken();
  const options = await post("/passkeys/v1/register/options", { token });
  expect(options.status).toBe(200);
  expect(options.body.data).toMatchObject({ rp_id: "licensing.test", user_id: f.userId, user_name: f.email });
  return post("/passkeys/v1/register", {
    token,
    ...authenticator.create(options.body.data.challenge, overrides),
  });
}

/** Start a verification and read code and approval link from the mail (past the 120 s between codes to an address). */
async function started(device: TestDevice) {
  t.clock.advance(121);
  const response = await startVerification(t, device, f, f.email);
  const mail = await smtp.waitForMail(f.email);
  const [verificationId, secret] = (mail.approvalUrl ?? "#.").split("#")[1]?.split(".") ?? [];
  if (mail.approvalUrl) expect(verificationId).toBe(response.body.data.verification_id);
  return {
    id: response.body.data.verification_id as string,
    code: mail.code ?? "",
    secret: secret ?? "",
    mail,
  };
}

async function approve(authenticator: SoftAuthenticator, id: string, secret: string, options = {}) {
  const challenge = await post("/passkeys/v1/approve/options", { verification_id: id, secret });
  expect(challenge.status).toBe(200);
  expect(challenge.body.data.allow_credentials).toContain(authenticator.id);
  return post("/passkeys/v1/approve", {
    verification_id: id,
    secret,
    ...authenticator.get(challenge.body.data.challenge, options),
  });
}

describe("registration", () => {
  test.each(["p256", "ed25519"] as const)(
    "a %s passkey registers once through the vendor's link",
    async (alg) => {
      const authenticator = new SoftAuthenticator(alg);
      const token = await registrationToken();
      const options = await post("/passkeys/v1/register/options", { token });
      const registered = await post("/passkeys/v1/register", {
        token,
        ...authenticator.create(options.body.data.challenge),
      });
      expect(registered.status).toBe(201);
      expect(registered.body.data.passkey_id).toStartWith("psk_");
      expect((await t.call("GET", `/mgmt/v1/license-users/${f.userId}`)).body.data.two_factor.passkeys).toBe(
        1,
      );
      // The link is spent.
      expect((await post("/passkeys/v1/register/options", { token })).status).toBe(404);
      expect(readFileSync(join(t.dir, "licensing.db")).includes(token)).toBe(false);
    },
  );

  test("a wrong origin, challenge or relying party is refused, and an expired link is 404", async () => {
    expect((await register(new SoftAuthenticator("p256"), { origin: "https://evil.example" })).status).toBe(
      422,
    );
    expect((await register(new SoftAuthenticator("p256"), { challenge: "AAAA" })).status).toBe(422);
    expect((await register(new SoftAuthenticator("p256", "evil.example"))).status).toBe(422);
    const token = await registrationToken();
    t.clock.advance(24 * 3600);
    expect((await post("/passkeys/v1/register/options", { token })).status).toBe(404);
    expect((await t.call("GET", `/mgmt/v1/license-users/${f.userId}`)).body.data.two_factor.passkeys).toBe(0);
  });

  test("a P-256 key off the curve, or CBOR text that is not UTF-8, is refused with 422 and stores nothing", async () => {
    const offCurve = new SoftAuthenticator("p256");
    Object.defineProperty(offCurve, "cose", {
      value: new Map<unknown, unknown>([
        [1, 2],
        [3, -7],
        [-1, 1],
        [-2, new Uint8Array(32).fill(1)],
        [-3, new Uint8Array(32).fill(2)],
      ]),
    });
    const refused = await register(offCurve);
    expect([refused.status, refused.body.error.code]).toEqual([422, "VALIDATION_FAILED"]);

    const token = await registrationToken();
    const options = await post("/passkeys/v1/register/options", { token });
    const { credential_id, client_data_json } = new SoftAuthenticator("p256").create(
      options.body.data.challenge,
    );
    // A map whose one key is two bytes of text that are not UTF-8 (C3 28).
    const attestation_object = Buffer.from([0xa1, 0x62, 0xc3, 0x28, 0x01]).toString("base64url");
    const garbled = await post("/passkeys/v1/register", {
      token,
      credential_id,
      client_data_json,
      attestation_object,
    });
    expect([garbled.status, garbled.body.error.code]).toEqual([422, "VALIDATION_FAILED"]);
    expect((await t.call("GET", `/mgmt/v1/license-users/${f.userId}`)).body.data.two_factor.passkeys).toBe(0);
  });

  test.each([
    ["turns two-factor off", () => t.call("DELETE", `/mgmt/v1/license-users/${f.userId}/two-factor`)],
    [
      "changes the user's address",
      () => t.call("PATCH", `/mgmt/v1/license-users/${f.userId}`, { body: { email: "new.ada@example.com" } }),
    ],
    [
      "disables the user and enables them again",
      async () => {
        await t.call("DELETE", `/mgmt/v1/license-users/${f.userId}`);
        return t.call("PATCH", `/mgmt/v1/license-users/${f.userId}`, { body: { status: "active" } });
      },
    ],
  ] as const)(
    "a link sent before the vendor %s registers nothing, even with its options fetched",
    async (_, act) => {
      const unopened = await registrationToken();
      const opened = await registrationToken();
      const options = await post("/passkeys/v1/register/options", { token: opened });
      expect((await act()).status).toBeLessThan(300);
      const late = await post("/passkeys/v1/register", {
        token: opened,
        ...new SoftAuthenticator("p256").create(options.body.data.challenge),
      });
      expect([late.status, late.body.error.code]).toEqual([404, "NOT_FOUND"]);
      expect((await post("/passkeys/v1/register/options", { token: unopened })).status).toBe(404);
      expect((await t.call("GET", `/mgmt/v1/license-users/${f.userId}`)).body.data.two_factor.passkeys).toBe(
        0,
      );
    },
  );

  test("registering checks the user again: one disabled after the options by a write that left the link (an older version's) registers nothing", async () => {
    const token = await registrationToken();
    const options = await post("/passkeys/v1/register/options", { token });
    t.deps.sqlite.run("UPDATE license_users SET status = 'disabled' WHERE id = ?", [f.userId]);
    const late = await post("/passkeys/v1/register", {
      token,
      ...new SoftAuthenticator("p256").create(options.body.data.challenge),
    });
    expect([late.status, late.body.error.code]).toEqual([404, "NOT_FOUND"]);
    expect((await t.call("GET", `/mgmt/v1/license-users/${f.userId}`)).body.data.two_factor.passkeys).toBe(0);
  });

  test("turning two-factor off ends a link left over beside a registered passkey, so the user signs in without one", async () => {
    expect((await register(new SoftAuthenticator("p256"))).status).toBe(201);
    const leftOver = await registrationToken();
    expect((await t.call("DELETE", `/mgmt/v1/license-users/${f.userId}/two-factor`)).status).toBe(204);
    const options = await post("/passkeys/v1/register/options", { token: leftOver });
    expect(options.status).toBe(404);
    const device = new TestDevice();
    const { id, code } = await started(device);
    expect((await confirmVerification(t, device, id, code)).status).toBe(200);
  });

  test("turning two-factor off where only an expired link is left changes nothing: no event, the same ETag", async () => {
    await registrationToken();
    t.clock.advance(25 * 3600);
    const before = await t.call("GET", `/mgmt/v1/license-users/${f.userId}`);
    expect((await t.call("DELETE", `/mgmt/v1/license-users/${f.userId}/two-factor`)).status).toBe(204);
    const after = await t.call("GET", `/mgmt/v1/license-users/${f.userId}`);
    expect(after.headers.get("etag")).toBe(before.headers.get("etag"));
    const events = (await t.call("GET", "/mgmt/v1/events")).body.data as { type: string }[];
    expect(events.filter((e) => e.type === "license_user.two_factor_disabled")).toEqual([]);
  });

  test("a new registration link ends the one before it: the older token is 404, the new one registers, and the event counts one ended", async () => {
    const older = await registrationToken();
    const newer = await registrationToken();
    expect((await post("/passkeys/v1/register/options", { token: older })).status).toBe(404);
    const options = await post("/passkeys/v1/register/options", { token: newer });
    expect(options.status).toBe(200);
    const registered = await post("/passkeys/v1/register", {
      token: newer,
      ...new SoftAuthenticator("p256").create(options.body.data.challenge),
    });
    expect(registered.status).toBe(201);
    const events = (await t.call("GET", "/mgmt/v1/events")).body.data as { type: string; data: unknown }[];
    const created = events.filter((e) => e.type === "license_user.passkey_link_created").map((e) => e.data);
    // Newest first: the second link ended the first; the first ended nothing.
    expect(created).toEqual([{ links_ended: 1 }, { links_ended: 0 }]);
  });

  test("the sweep deletes spent and expired registration links and keeps a live one, which still registers", async () => {
    const userWith = async (email: string) => {
      const user = await t.call("POST", "/mgmt/v1/license-users", { body: { email } });
      expect(user.status).toBe(201);
      return user.body.data.public_id as string;
    };
    const expiring = await userWith("expiring@example.com");
    const waiting = await userWith("waiting@example.com");
    expect((await register(new SoftAuthenticator("p256"))).status).toBe(201);
    await registrationToken(expiring);
    t.clock.advance(25 * 3600);
    const live = await registrationToken(waiting);
    const links = () =>
      t.deps.sqlite.query("SELECT user_id FROM passkey_registrations ORDER BY user_id").all() as {
        user_id: string;
      }[];
    expect(links().length).toBe(3);
    const done = sweepOnce(createServices(t.deps, { baseUrl: BASE_URL }), silentLogger);
    expect([done.passkey_links, links()]).toEqual([2, [{ user_id: waiting }]]);
    expect((await post("/passkeys/v1/register/options", { token: live })).status).toBe(200);
  });

  test("a registration is in the audit log as license_user.passkey_registered, by the license user", async () => {
    const registered = await register(new SoftAuthenticator("p256"));
    expect(registered.status).toBe(201);
    const events = await t.call("GET", "/mgmt/v1/events");
    const event = events.body.data.find(
      (e: { type: string }) => e.type === "license_user.passkey_registered",
    );
    expect(event).toMatchObject({
      actor: { type: "license_user", id: f.userId },
      target: { type: "license_user", id: f.userId, environment: "live" },
      data: { passkey_id: registered.body.data.passkey_id },
      request_id: registered.headers.get("x-request-id"),
    });
  });

  test("the pages are served self-contained with a strict Content-Security-Policy", async () => {
    for (const path of ["/passkeys/v1/register", "/passkeys/v1/approve"]) {
      const page = await t.call("GET", path, { key: null });
      expect(page.status).toBe(200);
      expect(page.headers.get("content-type")).toStartWith("text/html");
      expect(page.headers.get("content-security-policy")).toContain("default-src 'none'");
      expect(page.text).toContain("navigator.credentials");
      expect(page.text).not.toMatch(/src="http/);
    }
  });
});

/**
 * Runs a served page's inline script against stand-ins for the browser objects it uses (the
 * script throwing, as a browser would stop it, fails the call), and returns its output element,
 * its button, the button's click handler and the paths its requests went to.
 */
function openPage(script: string, pathname: string, hash: string) {
  const posted: string[] = [];
  let click: (() => Promise<void>) | undefined;
  const element = () => ({
    textContent: "",
    hidden: false,
    disabled: false,
    addEventListener: (_event: string, listener: () => Promise<void>) => {
      click = listener;
    },
  });
  const out = element();
  const button = element();
  const bytes = () => new Uint8Array([1, 2, 3]).buffer;
  const credential = {
    id: "cred",
    response: {
      clientDataJSON: bytes(),
      attestationObject: bytes(),
      authenticatorData: bytes(),
      signature: bytes(),
    },
  };
  const options = {
    challenge: "AAEC",
    rp_id: "licensing.test",
    user_id: "lu_1",
    user_name: "ada",
    exclude_credentials: [],
    allow_credentials: [],
  };
  const fetch = async (path: string) => {
    posted.push(path);
    const first = posted.length === 1;
    return {
      ok: first,
      json: async () => (first ? { data: options } : { error: { message: "stop" } }),
    };
  };
  const run = new Function("document", "location", "window", "navigator", "fetch", "history", script);
  run(
    { getElementById: (id: string) => (id === "out" ? out : button) },
    { pathname, hash },
    { PublicKeyCredential: {} },
    { credentials: { create: async () => credential, get: async () => credential } },
    fetch,
    { replaceState: () => {} },
  );
  return { out, button, click, posted };
}

async function pagePosts(script: string, pathname: string, hash: string): Promise<string[]> {
  const page = openPage(script, pathname, hash);
  expect(page.click).toBeDefined();
  await page.click?.();
  expect(page.out.textContent).toBe("stop");
  return page.posted;
}

const servedScript = async (path: string) => {
  const page = await t.call("GET", path, { key: null });
  const scripts = [...page.text.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1] as string);
  expect(scripts.length).toBe(1);
  return { page, script: scripts[0] as string };
};

describe("the pages' own requests", () => {
  test("go to the page's routes whether it was opened with or without a trailing slash; the CSP hash is the script's", async () => {
    for (const [path, hash] of [
      ["/passkeys/v1/register", "#token"],
      ["/passkeys/v1/approve", "#ver_1.secret"],
    ] as const) {
      for (const spelling of [path, `${path}/`]) {
        const { page, script } = await servedScript(spelling);
        expect(page.status).toBe(200);
        const digest = createHash("sha256").update(script).digest("base64");
        expect(page.headers.get("content-security-policy")).toContain(`script-src 'sha256-${digest}'`);
        expect(await pagePosts(script, spelling, hash)).toEqual([`${path}/options`, path]);
      }
    }
  });

  test.each([
    ["/passkeys/v1/register", "#%"],
    ["/passkeys/v1/register", "#abc%E0%A4%A"],
    ["/passkeys/v1/register", ""],
    ["/passkeys/v1/approve", "#%"],
    ["/passkeys/v1/approve", "#ver_1.secret%"],
    ["/passkeys/v1/approve", "#no-dot"],
    ["/passkeys/v1/approve", ""],
  ])(
    "%s opened with the fragment '%s' says the link is incomplete and hides its button",
    async (path, hash) => {
      const { script } = await servedScript(path);
      const page = openPage(script, path, hash);
      expect(page.out.textContent).toContain("This link is incomplete");
      expect(page.button.hidden).toBe(true);
    },
  );
});

describe("approval of a sign-in", () => {
  test("the mail links to approval; the passkey's approval code is the second factor, once", async () => {
    const authenticator = new SoftAuthenticator("p256");
    expect((await register(authenticator)).status).toBe(201);
    const device = new TestDevice();
    const { id, code, secret } = await started(device);
    const required = await confirmVerification(t, device, id, code);
    expect(required.body.error.code).toBe("TWO_FACTOR_REQUIRED");
    const approved = await approve(authenticator, id, secret);
    expect(approved.status).toBe(200);
    const approvalCode: string = approved.body.data.approval_code;
    expect(approvalCode).toMatch(/^[0-9]{8}$/);
    const ok = await confirmVerification(t, device, id, code, { second_factor_code: approvalCode });
    expect(ok.status).toBe(200);
    expect(
      (await activate(t, device, f, { body: { named_user_token: ok.body.data.named_user_token } })).status,
    ).toBe(201);

    // The code belonged to that verification only.
    const next = await started(device);
    const reused = await confirmVerification(t, device, next.id, next.code, {
      second_factor_code: approvalCode,
    });
    expect(reused.body.error.code).toBe("TWO_FACTOR_INVALID");
  });

  test("a forged signature, a replayed counter, a wrong origin or user presence missing is TWO_FACTOR_INVALID", async () => {
    const authenticator = new SoftAuthenticator("ed25519");
    await register(authenticator);
    const { id, secret } = await started(new TestDevice());
    const forged = new SoftAuthenticator("ed25519");
    Object.defineProperty(forged, "credentialId", { value: authenticator.credentialId });
    const bad = await approve(forged, id, secret);
    expect(bad.status).toBe(401);
    expect(bad.body.error.code).toBe("TWO_FACTOR_INVALID");
    expect(
      (await approve(authenticator, id, secret, { clientData: { origin: "https://evil.example" } })).status,
    ).toBe(401);
    expect((await approve(authenticator, id, secret, { flags: 0x04 })).status).toBe(401);
    expect((await approve(authenticator, id, secret)).status).toBe(200);
    const replay = await approve(authenticator, id, secret, { keepCounter: true });
    expect(replay.body.error.details.reason).toContain("counter");
  });

  test("a wrong secret, a used or replaced verification, and one without options are refused", async () => {
    const authenticator = new SoftAuthenticator("p256");
    await register(authenticator);
    const device = new TestDevice();
    const { id, secret } = await started(device);
    expect(
      (await post("/passkeys/v1/approve/options", { verification_id: id, secret: "A".repeat(43) })).status,
    ).toBe(410);
    const noOptions = await post("/passkeys/v1/approve", {
      verification_id: id,
      secret,
      ...authenticator.get("x"),
    });
    expect(noOptions.status).toBe(400);
    await started(device);
    expect((await post("/passkeys/v1/approve/options", { verification_id: id, secret })).status).toBe(410);
  });

  test("a wrong secret costs the same hashing for a verification with a user as for one without", async () => {
    await register(new SoftAuthenticator("p256"));
    const device = new TestDevice();
    const { id: matched } = await started(device);
    const unknown = await startVerification(t, device, f, "nobody@example.com");
    const lookupHash = t.deps.secrets.lookupHash.bind(t.deps.secrets);
    let hashes = 0;
    t.deps.secrets.lookupHash = (...args: Parameters<typeof lookupHash>) => {
      hashes++;
      return lookupHash(...args);
    };
    const hashesFor = async (verificationId: string) => {
      hashes = 0;
      const answer = await post("/passkeys/v1/approve/options", {
        verification_id: verificationId,
        secret: "A".repeat(43),
      });
      expect(answer.status).toBe(410);
      return hashes;
    };
    const withUser = await hashesFor(matched);
    expect(withUser).toBeGreaterThan(0);
    expect(await hashesFor(unknown.body.data.verification_id)).toBe(withUser);
  });

  test("turning two-factor off deletes the passkeys; on a view read before a passkey was registered it is refused", async () => {
    const userPath = `/mgmt/v1/license-users/${f.userId}`;
    const seen = (await t.call("GET", userPath)).headers.get("etag") as string;
    await register(new SoftAuthenticator("p256"));
    const stale = await t.call("DELETE", `${userPath}/two-factor`, { headers: { "if-match": seen } });
    expect([stale.status, stale.body.error.code]).toEqual([409, "VERSION_CONFLICT"]);
    expect((await t.call("GET", userPath)).body.data.two_factor.passkeys).toBe(1);
    expect((await t.call("DELETE", `/mgmt/v1/license-users/${f.userId}/two-factor`)).status).toBe(204);
    expect((await t.call("GET", `/mgmt/v1/license-users/${f.userId}`)).body.data.two_factor.passkeys).toBe(0);
    const device = new TestDevice();
    const { id, code, mail } = await started(device);
    expect(mail.approvalUrl).toBeNull();
    expect((await confirmVerification(t, device, id, code)).status).toBe(200);
  });
});

describe("an approval for a sign-in that can no longer succeed", () => {
  const passkeyRow = () =>
    t.deps.sqlite.query("SELECT sign_count, last_used_at FROM passkeys WHERE user_id = ?").get(f.userId);

  const ending = [
    ["the vendor disabled the user", () => t.call("DELETE", `/mgmt/v1/license-users/${f.userId}`)],
    [
      "the vendor removed the user's assignment",
      () => t.call("DELETE", `/mgmt/v1/license-assignments/${f.assignmentId}`),
    ],
    [
      "the vendor suspended the license",
      () => t.call("PATCH", `/mgmt/v1/licenses/${f.licenseId}`, { body: { status_action: "suspended" } }),
    ],
    [
      "the vendor changed the user's address",
      () => t.call("PATCH", `/mgmt/v1/license-users/${f.userId}`, { body: { email: "new.ada@example.com" } }),
    ],
    [
      "the workspace's plan no longer includes email license verification",
      async () => {
        t.workspace.setPlan("free");
        return { status: 200 };
      },
    ],
  ] as const;

  test.each(ending)(
    "is refused once %s, also with the page's options already fetched, and the passkey is not used",
    async (_, act) => {
      const authenticator = new SoftAuthenticator("p256");
      expect((await register(authenticator)).status).toBe(201);
      const { id, secret } = await started(new TestDevice());
      const options = await post("/passkeys/v1/approve/options", { verification_id: id, secret });
      expect(options.status).toBe(200);
      const before = passkeyRow();
      expect((await act()).status).toBeLessThan(300);
      const late = await post("/passkeys/v1/approve", {
        verification_id: id,
        secret,
        ...authenticator.get(options.body.data.challenge),
      });
      expect([late.status, late.body.error.code]).toEqual([410, "EMAIL_VERIFICATION_EXPIRED"]);
      expect(late.body.data).toBeUndefined();
      expect(passkeyRow()).toEqual(before);
      const again = await post("/passkeys/v1/approve/options", { verification_id: id, secret });
      expect([again.status, again.body.error.code]).toEqual([410, "EMAIL_VERIFICATION_EXPIRED"]);
    },
  );

  test("is refused once the verification's five attempts are used up", async () => {
    const authenticator = new SoftAuthenticator("p256");
    await register(authenticator);
    const device = new TestDevice();
    const { id, secret } = await started(device);
    for (let i = 0; i < 5; i++) {
      const wrong = await confirmVerification(t, device, id, "000000");
      expect(wrong.body.error.code).toBe("EMAIL_VERIFICATION_CODE_INVALID");
    }
    const before = passkeyRow();
    const refused = await post("/passkeys/v1/approve/options", { verification_id: id, secret });
    expect([refused.status, refused.body.error.code]).toEqual([410, "EMAIL_VERIFICATION_EXPIRED"]);
    expect(passkeyRow()).toEqual(before);
  });

  test("is refused once the product, license key and address have had 10 wrong codes in 24 hours", async () => {
    const authenticator = new SoftAuthenticator("p256");
    await register(authenticator);
    const device = new TestDevice();
    for (let round = 0; round < 2; round++) {
      const { id } = await started(device);
      for (let i = 0; i < 5; i++) await confirmVerification(t, device, id, "000000");
    }
    const { id, code, secret } = await started(device);
    // The confirm answers 410 whatever it is sent: an approval code would be of no use.
    expect((await confirmVerification(t, device, id, code)).body.error.code).toBe(
      "EMAIL_VERIFICATION_EXPIRED",
    );
    const refused = await post("/passkeys/v1/approve/options", { verification_id: id, secret });
    expect([refused.status, refused.body.error.code]).toEqual([410, "EMAIL_VERIFICATION_EXPIRED"]);
  });

  test("is refused with 403 TWO_FACTOR_LOCKED while two-factor is locked, and works again once the vendor unlocks", async () => {
    const authenticator = new SoftAuthenticator("p256");
    await register(authenticator);
    const device = new TestDevice();
    // Ten wrong second factors in a row lock two-factor (five attempts per verification).
    for (let round = 0; round < 2; round++) {
      const { id, code } = await started(device);
      for (let i = 0; i < 5; i++) {
        const wrong = await confirmVerification(t, device, id, code, { second_factor_code: "12345678" });
        expect(wrong.body.error.code).toBe("TWO_FACTOR_INVALID");
      }
    }
    const { id, code, secret } = await started(device);
    expect((await confirmVerification(t, device, id, code)).body.error.code).toBe("TWO_FACTOR_LOCKED");
    const before = passkeyRow();
    const options = await post("/passkeys/v1/approve/options", { verification_id: id, secret });
    expect([options.status, options.body.error.code]).toEqual([403, "TWO_FACTOR_LOCKED"]);
    expect(passkeyRow()).toEqual(before);

    expect((await t.call("POST", `/mgmt/v1/license-users/${f.userId}/two-factor/unlock`)).status).toBe(200);
    const approved = await approve(authenticator, id, secret);
    expect(approved.status).toBe(200);
    const ok = await confirmVerification(t, device, id, code, {
      second_factor_code: approved.body.data.approval_code,
    });
    expect(ok.status).toBe(200);
  });

  test("locking between the options and the approval is refused too, and uses no passkey counter", async () => {
    const authenticator = new SoftAuthenticator("p256");
    await register(authenticator);
    const { id, secret } = await started(new TestDevice());
    const options = await post("/passkeys/v1/approve/options", { verification_id: id, secret });
    t.deps.sqlite.run("UPDATE license_users SET two_factor_locked_at = ? WHERE id = ?", [
      Date.now(),
      f.userId,
    ]);
    const before = passkeyRow();
    const late = await post("/passkeys/v1/approve", {
      verification_id: id,
      secret,
      ...authenticator.get(options.body.data.challenge),
    });
    expect([late.status, late.body.error.code]).toEqual([403, "TWO_FACTOR_LOCKED"]);
    expect(passkeyRow()).toEqual(before);
  });
});

describe("approving one sign-in twice (two tabs, or a phone and a laptop)", () => {
  test("shows the same code both times, and that code signs in, with no attempt or lock step spent", async () => {
    const authenticator = new SoftAuthenticator("p256");
    await register(authenticator);
    const device = new TestDevice();
    const { id, code, secret } = await started(device);
    const first = await approve(authenticator, id, secret);
    const second = await approve(authenticator, id, secret);
    expect([first.status, second.status]).toEqual([200, 200]);
    expect(second.body.data.approval_code).toBe(first.body.data.approval_code);
    const ok = await confirmVerification(t, device, id, code, {
      second_factor_code: first.body.data.approval_code,
    });
    expect(ok.status).toBe(200);
    const user = await t.call("GET", `/mgmt/v1/license-users/${f.userId}`);
    expect(user.body.data.two_factor.locked).toBe(false);
    expect(
      t.deps.sqlite.query("SELECT second_factor_failures AS n FROM license_users WHERE id = ?").get(f.userId),
    ).toEqual({ n: 0 });
    // Once used, the link gives no code again.
    const after = await post("/passkeys/v1/approve/options", { verification_id: id, secret });
    expect([after.status, after.body.error.code]).toEqual([410, "EMAIL_VERIFICATION_EXPIRED"]);
  });

  test("each verification has its own code, and none is stored in the clear", async () => {
    const authenticator = new SoftAuthenticator("p256");
    await register(authenticator);
    const device = new TestDevice();
    const one = await started(device);
    const codeOne = (await approve(authenticator, one.id, one.secret)).body.data.approval_code as string;
    const two = await started(device);
    const codeTwo = (await approve(authenticator, two.id, two.secret)).body.data.approval_code as string;
    expect(codeTwo).not.toBe(codeOne);
    for (const file of ["licensing.db", "licensing.db-wal"]) {
      const path = join(t.dir, file);
      const stored = existsSync(path) ? readFileSync(path) : Buffer.alloc(0);
      expect(stored.includes(codeOne) || stored.includes(codeTwo)).toBe(false);
    }
  });
});
