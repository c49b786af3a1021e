import { describe, expect, test } from "bun:test";
import { evaluateLicense, type LicenseInputs, type VerifiedCertificate } from "../../src/sdk/index.ts";
import { T0 } from "./support/authority.ts";
import { activated } from "./support/setup.ts";

const EXP = T0 + 86_400;

describe("license state from the cached certificate", () => {
  test("the license is valid until exp, in grace until exp + grace_sec, then invalid", async () => {
    const h = await activated();
    const at = async (sec: number) => {
      h.clock.ms = sec * 1000;
      return h.client.licenseInfo();
    };
    expect(await at(EXP - 1)).toMatchObject({
      state: "valid",
      reason: "ok",
      expiresAt: EXP,
      graceEndsAt: EXP + 7200,
    });
    expect(await at(EXP)).toMatchObject({ state: "grace", reason: "grace" });
    expect(await at(EXP + 7199)).toMatchObject({ state: "grace" });
    expect(await at(EXP + 7200)).toMatchObject({ state: "invalid", reason: "expired" });
  });

  test("a fail-closed policy (grace_sec 0) has no grace after exp", async () => {
    const h = await activated();
    h.server.certificateClaims = { heartbeat: { required: true, interval_sec: 3600, grace_sec: 0 } };
    await h.client.heartbeat();
    h.clock.ms = (EXP - 1) * 1000;
    expect(await h.client.licenseState()).toBe("valid");
    h.clock.ms = EXP * 1000;
    const info = await h.client.licenseInfo();
    expect(info).toMatchObject({ state: "invalid", reason: "expired" });
    expect(info.graceEndsAt).toBeUndefined();
  });

  test("grace never extends past the license's own expiry", async () => {
    const h = await activated();
    h.server.certificateClaims = {
      license: {
        status: "active",
        type: "subscription",
        expires_at: EXP + 60,
        entitlements: {},
        policy_id: "p",
        max_concurrent: null,
      },
    };
    await h.client.heartbeat();
    h.clock.ms = (EXP + 59) * 1000;
    expect(await h.client.licenseState()).toBe("grace");
    h.clock.ms = (EXP + 60) * 1000;
    expect(await h.client.licenseInfo()).toMatchObject({ state: "invalid", reason: "license_expired" });
  });

  test("a local clock more than 300 seconds behind the verified server time is reported as tampered", async () => {
    const h = await activated();
    h.server.serverTime = T0 + 1000;
    await h.client.serverTime();
    h.clock.ms = (T0 + 700) * 1000;
    expect(await h.client.licenseState()).toBe("valid");
    h.clock.ms = (T0 + 699) * 1000;
    expect(await h.client.licenseInfo()).toMatchObject({
      state: "clock_tampered",
      serverTimeHighWater: T0 + 1000,
    });
    expect(await h.client.hasEntitlement("pro")).toBe(false);
  });

  test("the time high-water mark survives a restart, so winding the clock back is still detected", async () => {
    const h = await activated();
    h.server.serverTime = T0 + 5000;
    await h.client.serverTime();
    h.clock.ms = T0 * 1000;
    const restarted = h.restart({
      fetch: async () => {
        throw new TypeError("offline");
      },
    });
    expect(await restarted.licenseState()).toBe("clock_tampered");
  });

  test("a device clock that ran an hour fast and is corrected right after a server contact is forgiven", async () => {
    const h = await activated();
    h.server.serverTime = T0 + 1000;
    h.clock.ms = (T0 + 1000 + 3600) * 1000;
    await h.client.serverTime();
    h.clock.ms = (T0 + 1060) * 1000;
    expect(await h.client.licenseInfo()).toMatchObject({ state: "valid", reason: "ok" });
    // Winding it back past the verified time is still caught.
    h.clock.ms = (T0 + 1000 - 301) * 1000;
    expect(await h.client.licenseState()).toBe("clock_tampered");
  });

  test("an unverified server time never raises the high-water mark", async () => {
    const h = await activated();
    h.server.sign = (req) => (req.path === "/runtime/v1/time" ? { nonce: "x".repeat(22) } : {});
    h.server.serverTime = T0 + 10_000;
    await expect(h.client.serverTime()).rejects.toThrow();
    expect((await h.client.licenseInfo()).serverTimeHighWater).toBe(T0);
  });

  test("a certificate or last heartbeat saying suspended makes the license invalid", async () => {
    const h = await activated();
    h.server.licenseStatus = "suspended";
    await h.client.heartbeat();
    expect(await h.client.licenseInfo()).toMatchObject({ state: "invalid", reason: "suspended" });
    h.server.licenseStatus = "active";
    h.server.certificateClaims = {
      license: {
        status: "suspended",
        type: "subscription",
        expires_at: null,
        entitlements: {},
        policy_id: "p",
        max_concurrent: null,
      },
    };
    await h.client.heartbeat();
    expect(await h.client.licenseInfo()).toMatchObject({ state: "invalid", reason: "suspended" });
  });

  test("a certificate altered in storage is not trusted", async () => {
    const h = await activated();
    const key = `svc.v1.live.${h.server.authority.productId}.certificate`;
    const [hd, p, s] = (await h.storage.get(key))!.split(".");
    const claims = JSON.parse(Buffer.from(p!, "base64url").toString());
    claims.exp += 365 * 86_400;
    await h.storage.set(key, `${hd}.${Buffer.from(JSON.stringify(claims)).toString("base64url")}.${s}`);
    expect(await h.client.licenseInfo()).toMatchObject({ state: "invalid", reason: "certificate_invalid" });
  });

  test("a device that never activated is invalid", async () => {
    const h = await activated();
    await h.client.deactivate();
    expect(await h.client.licenseInfo()).toMatchObject({
      state: "invalid",
      reason: "not_activated",
      entitlements: {},
    });
  });
});

describe("evaluateLicense", () => {
  const cert = {
    jws: "x",
    header: { alg: "EdDSA", kid: "k", typ: "service-license+jwt" },
    claims: {
      exp: 1000,
      license: { status: "active", expires_at: null, entitlements: { a: true } },
      heartbeat: { required: true, interval_sec: 60, grace_sec: 100 },
    },
  } as unknown as VerifiedCertificate;
  const base: LicenseInputs = {
    nowSec: 500,
    highWater: undefined,
    activation: {
      activation_id: "act",
      license_id: "lic",
      machine_info: { os: "o", arch: "a" },
      machine_info_digest: "d",
    },
    denial: undefined,
    certificate: cert,
    lastHeartbeat: undefined,
  };

  test("clock tampering wins over every other state", () => {
    expect(evaluateLicense({ ...base, highWater: 801 }).state).toBe("clock_tampered");
    expect(evaluateLicense({ ...base, highWater: 800 }).state).toBe("valid");
  });

  test("a stored denial applies only to the activation it was received for", () => {
    const denial = { code: "LICENSE_EXPIRED", activation_id: "act", server_time: 1, request_id: "r" };
    expect(evaluateLicense({ ...base, denial }).reason).toBe("license_expired");
    expect(evaluateLicense({ ...base, denial: { ...denial, activation_id: "old" } }).state).toBe("valid");
  });

  test("the boundaries of exp and grace are exclusive", () => {
    expect(evaluateLicense({ ...base, nowSec: 999 }).state).toBe("valid");
    expect(evaluateLicense({ ...base, nowSec: 1000 }).state).toBe("grace");
    expect(evaluateLicense({ ...base, nowSec: 1099 }).state).toBe("grace");
    expect(evaluateLicense({ ...base, nowSec: 1100 }).state).toBe("invalid");
  });
});

describe("a clock set back while offline", () => {
  test("is caught by the local high-water mark even when no server time was seen since", () => {
    const base = {
      activation: undefined,
      denial: undefined,
      certificate: undefined,
      lastHeartbeat: undefined,
    };
    // Signed time is old (activation), the device has since run two days offline, then the clock goes back.
    const twoDaysLater = 1_000 + 2 * 86_400;
    expect(
      evaluateLicense({ ...base, nowSec: 1_000 + 3_600, highWater: 1_000, localHighWater: twoDaysLater })
        .state,
    ).toBe("clock_tampered");
    expect(
      evaluateLicense({ ...base, nowSec: twoDaysLater + 10, highWater: 1_000, localHighWater: twoDaysLater })
        .state,
    ).not.toBe("clock_tampered");
  });
});
