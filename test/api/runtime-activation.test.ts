import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { ed25519 } from "@noble/curves/ed25519.js";
import { TestDevice } from "../support/device.ts";
import { expectSignedEnvelope, verifiedCertificate } from "../support/envelope.ts";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { activate, nowSec, type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, { policy: { max_machines: 2, entitlements: { export: true } } });
});
afterEach(() => t.close());

const activations = () =>
  (t.deps.sqlite.query("SELECT count(*) AS n FROM activations").get() as { n: number }).n;

describe("happy path", () => {
  test.each(["ed25519", "p256"] as const)(
    "an %s device activates and gets a signed, device-bound certificate",
    async (alg) => {
      const device = new TestDevice(alg);
      const response = await activate(t, device, fx);
      expect(response.status).toBe(201);
      expectSignedEnvelope(response.body, {
        status: 201,
        nonce: response.body.response_assertion.nonce,
        productId: fx.productId,
        bundle: fx.bundle,
      });
      const { header, claims } = verifiedCertificate(response.body.data.certificate, fx.bundle);
      expect(header).toMatchObject({ alg: "EdDSA", typ: "service-license+jwt" });
      expect(claims).toMatchObject({
        sub: fx.licenseId,
        aud: fx.productId,
        activation_id: response.body.data.activation_id,
        cnf: { jkt: device.thumbprint },
        machine_info_digest: response.body.data.machine_info_digest,
        license: {
          status: "active",
          type: "perpetual",
          entitlements: { export: true },
          policy_id: fx.policyId,
        },
      });
      expect(claims.exp - claims.iat).toBe(t.workspace.plan().policy_defaults.cert_ttl_sec);
      expect(claims.nbf).toBe(claims.iat - 300);
    },
  );

  test("the signed nonce is the one the device sent", async () => {
    const device = new TestDevice();
    const body = device.activationBody({
      licenseKey: fx.licenseKey,
      productId: fx.productId,
      clientTime: nowSec(t),
    });
    const response = await t.call("POST", "/runtime/v1/activations", {
      key: null,
      body,
      headers: { "idempotency-key": "activation-nonce-check" },
    });
    expectSignedEnvelope(response.body, {
      status: 201,
      nonce: body.nonce as string,
      productId: fx.productId,
      bundle: fx.bundle,
    });
  });

  test("the license key may be typed in lower case without dashes", async () => {
    const response = await activate(t, new TestDevice(), {
      ...fx,
      licenseKey: fx.licenseKey.replaceAll("-", "").toLowerCase(),
    });
    expect(response.status).toBe(201);
  });

  test("the same device activating again gets its existing activation, not a second slot", async () => {
    const device = new TestDevice();
    const first = await activate(t, device, fx);
    const second = await activate(t, device, fx);
    expect(second.status).toBe(201);
    expect(second.body.data.activation_id).toBe(first.body.data.activation_id);
    expect(activations()).toBe(1);
  });

  test("a retry with the same Idempotency-Key replays the result, re-signed for the new nonce", async () => {
    const device = new TestDevice();
    const first = await activate(t, device, fx, { idempotencyKey: "activation-retry-0001" });
    const retryBody = device.activationBody({
      licenseKey: fx.licenseKey,
      productId: fx.productId,
      clientTime: nowSec(t),
    });
    const retry = await t.call("POST", "/runtime/v1/activations", {
      key: null,
      body: retryBody,
      headers: { "idempotency-key": "activation-retry-0001" },
    });
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(retry.body.data).toEqual(first.body.data);
    expectSignedEnvelope(retry.body, {
      status: 201,
      nonce: retryBody.nonce as string,
      productId: fx.productId,
      bundle: fx.bundle,
    });
    expect(activations()).toBe(1);
  });
});

describe("errors", () => {
  const codeOf = async (response: Promise<{ status: number; body: { error: { code: string } } }>) => {
    const r = await response;
    return [r.status, r.body.error?.code];
  };

  test("a wrong license key is 401 and an unknown product 404", async () => {
    expect(
      await codeOf(activate(t, new TestDevice(), { ...fx, licenseKey: "ZZZZZ-ZZZZZ-ZZZZZ-ZZZZZ-ZZZZZ" })),
    ).toEqual([401, "LICENSE_KEY_INVALID"]);
    const other = await runtimeFixture(t);
    expect(await codeOf(activate(t, new TestDevice(), { ...fx, licenseKey: other.licenseKey }))).toEqual([
      401,
      "LICENSE_KEY_INVALID",
    ]);
    expect(
      await codeOf(activate(t, new TestDevice(), { ...fx, productId: "prod_01M81Z00000000000000000000" })),
    ).toEqual([404, "NOT_FOUND"]);
  });

  test("a proof that does not match the body, or a truncated or forged one, is 401 and activates nothing", async () => {
    const device = new TestDevice();
    const body = device.activationBody({
      licenseKey: fx.licenseKey,
      productId: fx.productId,
      clientTime: nowSec(t),
    });
    const tampered = { ...body, machine_info: { os: "windows", arch: "x64" } };
    const truncated = { ...body, device_proof: (body.device_proof as string).slice(0, 40) };
    const forged = { ...body, device_proof: new TestDevice().sign("Service-Activation-Proof-v1\n{}") };
    for (const attempt of [tampered, truncated, forged]) {
      const response = await t.call("POST", "/runtime/v1/activations", {
        key: null,
        body: attempt,
        headers: t.idem(),
      });
      expect(response.status).toBe(401);
      expect(response.body.error.code).toBe("DEVICE_PROOF_INVALID");
    }
    expect(activations()).toBe(0);
  });

  test("a device clock 301 seconds off is refused with the server time", async () => {
    t.clock.freeze();
    const response = await activate(t, new TestDevice(), fx, { clientTime: nowSec(t) - 301 });
    expect(response.status).toBe(401);
    expect(response.body.error).toMatchObject({ code: "CLOCK_SKEW", details: { server_time: nowSec(t) } });
    expect((await activate(t, new TestDevice(), fx, { clientTime: nowSec(t) + 300 })).status).toBe(201);
  });

  test("revoked, expired and suspended licenses are refused with signed denials", async () => {
    const device = new TestDevice();
    await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body: { status_action: "suspended" } });
    const suspended = await activate(t, device, fx);
    expect(suspended.status).toBe(403);
    expect(suspended.body.error.code).toBe("LICENSE_SUSPENDED");
    expectSignedEnvelope(suspended.body, {
      status: 403,
      nonce: suspended.body.response_assertion.nonce,
      productId: fx.productId,
      bundle: fx.bundle,
    });
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    const revoked = await activate(t, device, fx);
    expect(revoked.body.error.code).toBe("LICENSE_REVOKED");
    expectSignedEnvelope(revoked.body, {
      status: 403,
      nonce: revoked.body.response_assertion.nonce,
      productId: fx.productId,
      bundle: fx.bundle,
    });
    const expiring = await runtimeFixture(t, {
      license: { expires_at: new Date(t.clock.now().getTime() + 3_600_000).toISOString() },
    });
    t.clock.advance(3601);
    const expired = await activate(t, device, expiring);
    expect(expired.body.error.code).toBe("LICENSE_EXPIRED");
    expect(activations()).toBe(0);
  });

  test("a full license answers 409 MACHINE_LIMIT_REACHED", async () => {
    expect((await activate(t, new TestDevice(), fx)).status).toBe(201);
    expect((await activate(t, new TestDevice("p256"), fx)).status).toBe(201);
    const third = await activate(t, new TestDevice(), fx);
    expect(third.status).toBe(409);
    expect(third.body.error).toMatchObject({ code: "MACHINE_LIMIT_REACHED", details: { max_machines: 2 } });
  });

  test("a license used only through offline packages answers 422", async () => {
    for (const policy of [{ validation_mode: "offline" }, { perpetual_mode: "unmanaged" }]) {
      const offline = await runtimeFixture(t, { policy });
      const response = await activate(t, new TestDevice(), offline);
      expect(response.status).toBe(422);
      expect(response.body.error.code).toBe("OFFLINE_ACTIVATION_REQUIRED");
    }
  });

  test("a named-user license needs a named_user_token", async () => {
    const named = await runtimeFixture(t, { policy: { identity_mode: "named_user" } });
    const response = await activate(t, new TestDevice(), named);
    expect(response.status).toBe(401);
    expect(response.body.error.code).toBe("NAMED_USER_TOKEN_INVALID");
  });

  test("a blocked device or license is refused with 403", async () => {
    const device = new TestDevice();
    await t.call("POST", "/mgmt/v1/device-blocks", {
      body: { kind: "device_key", device_signing_key_thumbprint: device.thumbprint },
    });
    expect(await codeOf(activate(t, device, fx))).toEqual([403, "DEVICE_BLOCKED"]);
    await t.call("POST", "/mgmt/v1/device-blocks", { body: { kind: "license", license_id: fx.licenseId } });
    expect(await codeOf(activate(t, new TestDevice(), fx))).toEqual([403, "LICENSE_BLOCKED"]);
  });

  test("machine_signals names are 1-64 UTF-16 code units: an empty, a 65- or a 1000-character name is 422 keyed at machine_signals and activates nothing", async () => {
    for (const name of ["", "n".repeat(65), "n".repeat(1000), "😀".repeat(33)]) {
      const response = await activate(t, new TestDevice(), fx, {
        body: { machine_signals: { ok: "v", [name]: "v" } },
      });
      expect({ length: name.length, status: response.status }).toEqual({ length: name.length, status: 422 });
      expect(response.body.error).toMatchObject({
        code: "VALIDATION_FAILED",
        details: { errors: { machine_signals: ["member names are 1-64 characters"] } },
      });
    }
    expect(activations()).toBe(0);
    // One device activating again each time: the license has two slots.
    const device = new TestDevice();
    for (const name of ["n", "n".repeat(64), "😀".repeat(32)]) {
      const response = await activate(t, device, fx, {
        body: { machine_signals: { [name]: "v" } },
      });
      expect({ length: name.length, status: response.status }).toEqual({ length: name.length, status: 201 });
    }
  });

  test("a machine_signals member whose name holds a line break is still checked: its value must be a string", async () => {
    const response = await activate(t, new TestDevice(), fx, {
      body: { machine_signals: { "host\nname": { nested: [1, 2, 3] } } },
    });
    expect(response.status).toBe(422);
    expect(Object.keys(response.body.error.details.errors)).toEqual(["machine_signals.host\nname"]);
    expect(activations()).toBe(0);
  });

  test("a KEM key that is not P-256, or a malformed signing key, answers 422", async () => {
    const device = new TestDevice();
    const ed = new TestDevice("ed25519").signingPublic;
    for (const extra of [{ device_kem_public_key: ed }, { device_signing_public_key: "ed25519:short" }]) {
      const body = {
        ...device.activationBody({
          licenseKey: fx.licenseKey,
          productId: fx.productId,
          clientTime: nowSec(t),
        }),
        ...extra,
      };
      const response = await t.call("POST", "/runtime/v1/activations", {
        key: null,
        body,
        headers: t.idem(),
      });
      expect(response.status).toBe(422);
    }
  });

  test("an Ed25519 signing key off the curve answers 422 whatever else is wrong, and activates nothing", async () => {
    // The first y (SHA-256 of a counter) that is not on the curve: no one holds its private key,
    // so the proof can only be one made by another key.
    let offCurve = new Uint8Array(32);
    for (let i = 0; ; i++) {
      offCurve = Uint8Array.from(createHash("sha256").update(`off-curve ${i}`).digest());
      offCurve[31] = (offCurve[31] as number) & 0x7f;
      try {
        ed25519.Point.fromBytes(offCurve);
      } catch {
        break;
      }
    }
    const device = new TestDevice();
    t.clock.freeze();
    for (const clientTime of [nowSec(t), nowSec(t) - 301]) {
      const body = {
        ...device.activationBody({ licenseKey: fx.licenseKey, productId: fx.productId, clientTime }),
        device_signing_public_key: `ed25519:${Buffer.from(offCurve).toString("base64url")}`,
      };
      const response = await t.call("POST", "/runtime/v1/activations", {
        key: null,
        body,
        headers: t.idem(),
      });
      expect(response.status).toBe(422);
      expect(response.body.error.code).toBe("VALIDATION_FAILED");
      expect(Object.keys(response.body.error.details.errors)).toEqual(["device_signing_public_key"]);
    }
    expect(activations()).toBe(0);
  });

  test("a product whose signing keys are pending answers 409 SIGNING_KEY_PENDING", async () => {
    const pending = factories(t).product({ signingStatus: "pending" });
    const policy = factories(t).policy({ productId: pending.id });
    const { key } = factories(t).license({ productId: pending.id, policyId: policy.id });
    const response = await activate(t, new TestDevice(), { productId: pending.id, licenseKey: key });
    expect(response.status).toBe(409);
    expect(response.body.error).toMatchObject({ code: "SIGNING_KEY_PENDING", retryable: true });
  });

  test("a body over 16 KiB answers 413 and a missing Idempotency-Key 400", async () => {
    const device = new TestDevice();
    const big = device.activationBody({
      licenseKey: fx.licenseKey,
      productId: fx.productId,
      clientTime: nowSec(t),
      extra: { request_id: "r", machine_signals: { a: "x".repeat(200) }, app_version: "1" },
    });
    const padded = JSON.stringify(big).replace(
      '"app_version"',
      `"pad":"${"x".repeat(17_000)}","app_version"`,
    );
    const tooBig = await t.call("POST", "/runtime/v1/activations", {
      key: null,
      rawBody: padded,
      headers: { "content-type": "application/json", ...t.idem() },
    });
    expect(tooBig.status).toBe(413);
    const noKey = await t.call("POST", "/runtime/v1/activations", { key: null, body: big });
    expect(noKey.status).toBe(400);
    expect(activations()).toBe(0);
  });
});
