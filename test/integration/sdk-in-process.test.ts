import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createPublicKey, generateKeyPairSync, type KeyObject } from "node:crypto";
import { signDelegation, signedResponseText } from "../../src/crypto/envelope.ts";
import { signCompactJws } from "../../src/crypto/jws.ts";
import { keyIdOf, privateKeyFromPkcs8, publicKeyText } from "../../src/crypto/keys.ts";
import { productSigningEntryId } from "../../src/crypto/keystore.ts";
import { TrustService } from "../../src/modules/trust/service.ts";
import { LicensingClient, MemoryStorage, SdkError } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * The SDK (an independent implementation of the contract, @noble only) against the real server
 * in-process: every answer must pass its whole verification chain.
 */
let t: TestContext;
let fx: RuntimeFixture;
// biome-ignore lint/suspicious/noExplicitAny: the integration config is JSON from the API.
let config: any;

// biome-ignore lint/suspicious/noExplicitAny: the tests reach into arbitrary response JSON to alter it.
type Json = Record<string, any>;
type Rewrite = (url: string, body: string, status: number) => { body: string; status: number } | undefined;
let rewrite: Rewrite | undefined;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: {
      license_type: "subscription",
      max_machines: 5,
      max_concurrent: 2,
      concurrency_unit: "instance",
      entitlements: { export: true },
    },
  });
  config = (await t.call("GET", `/mgmt/v1/products/${fx.productId}/integration-config`)).body.data.config;
  rewrite = undefined;
});
afterEach(() => t.close());

/** The app's own handler as the SDK's fetch, with an optional man in the middle. */
async function inProcessFetch(url: string, init?: RequestInit): Promise<Response> {
  const response = await t.app.handle(new Request(url, init));
  const text = await response.text();
  const changed = rewrite?.(url, text, response.status);
  return new Response(changed?.body ?? text, {
    status: changed?.status ?? response.status,
    headers: response.headers,
  });
}

const client = (alg: "ed25519" | "p256" = "ed25519") =>
  new LicensingClient({
    config,
    fetch: inProcessFetch as never,
    now: () => t.clock.now().getTime(),
    signingAlgorithm: alg,
    appVersion: "2.0.0",
  });

const machineInfo = { os: "linux", arch: "x64" };

async function sdkError(promise: Promise<unknown>): Promise<SdkError> {
  try {
    await promise;
  } catch (error) {
    if (error instanceof SdkError) return error;
    throw error;
  }
  throw new Error("expected the SDK to refuse");
}

describe.each(["ed25519", "p256"] as const)("with %s device keys", (alg) => {
  test("activate, check in, take and release a seat, read signed time, deactivate", async () => {
    const app = client(alg);
    const activation = await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    expect(activation.activationId).toMatch(/^act_/);
    expect(await app.licenseState()).toBe("valid");
    expect(await app.hasEntitlement("export")).toBe(true);
    t.clock.advance(120);
    const beat = await app.heartbeat();
    expect(beat.licenseStatus).toBe("active");
    const lease = await app.acquireLease("instance-1");
    expect((await app.heartbeatLease(lease.leaseId, "instance-1")).leaseId).toBe(lease.leaseId);
    expect((await app.releaseLease(lease.leaseId, "instance-1")).status).toBe("released");
    const time = await app.serverTime();
    // The test clock runs with real time, so the second may turn between the two readings.
    expect(Math.abs(time.serverTime - Math.floor(t.clock.now().getTime() / 1000))).toBeLessThanOrEqual(1);
    await app.deactivate();
    const row = t.deps.sqlite
      .query<{ status: string }, [string]>("SELECT status FROM activations WHERE id = ?")
      .get(activation.activationId);
    expect(row?.status).toBe("deactivated");
  });

  test("a revocation reaches the device as an authentic denial and the license turns invalid", async () => {
    const app = client(alg);
    await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    const error = await sdkError(app.heartbeat());
    expect(error.kind).toBe("license");
    expect(error.code).toBe("LICENSE_REVOKED");
    expect(await app.licenseState()).toBe("invalid");
  });
});

describe("the SDK refuses real responses that were altered in transit", () => {
  const tamper =
    (mutate: (body: Json) => void): Rewrite =>
    (url, text, status) => {
      if (!url.includes("/heartbeat")) return undefined;
      const body = JSON.parse(text);
      mutate(body);
      return { body: JSON.stringify(body), status };
    };

  test.each([
    [
      "its data",
      (b: Json) => {
        b.data.license_status = "suspended";
      },
      "BODY_HASH_MISMATCH",
    ],
    [
      "its nonce",
      (b: Json) => {
        b.response_assertion.nonce = "x".repeat(22);
      },
      "RESPONSE_SIGNATURE_INVALID",
    ],
    [
      "its signature",
      (b: Json) => {
        b.response_signature = b.response_signature.replace(/^./, (c: string) => (c === "A" ? "B" : "A"));
      },
      "RESPONSE_SIGNATURE_INVALID",
    ],
    [
      "its delegation",
      (b: Json) => {
        b.signing_delegation.delegation.expires_at += 86_400;
      },
      "DELEGATION_SIGNATURE_INVALID",
    ],
  ])("a heartbeat with altered %s is refused", async (_what, mutate, code) => {
    const app = client();
    await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    rewrite = tamper(mutate);
    const error = await sdkError(app.heartbeat());
    expect(error.kind).toBe("verification");
    expect(error.code).toBe(code);
  });

  test("a heartbeat answer replayed to a later request (other nonce) is refused", async () => {
    const app = client();
    await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    let captured: string | undefined;
    rewrite = (url, text, status) => {
      if (!url.includes("/heartbeat")) return undefined;
      if (!captured) {
        captured = text;
        return undefined;
      }
      return { body: captured, status };
    };
    await app.heartbeat();
    expect((await sdkError(app.heartbeat())).code).toBe("NONCE_MISMATCH");
  });

  test("a signed success shown with another HTTP status is refused", async () => {
    const app = client();
    await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    rewrite = (url, text) => (url.includes("/heartbeat") ? { body: text, status: 201 } : undefined);
    expect((await sdkError(app.heartbeat())).code).toBe("STATUS_MISMATCH");
  });

  test("a trust bundle older than the one the device holds is refused", async () => {
    const storage = new MemoryStorage();
    const app = new LicensingClient({
      config,
      fetch: inProcessFetch as never,
      now: () => t.clock.now().getTime(),
      storage,
    });
    const older = (await t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, { key: null }))
      .text;
    new TrustService(t.deps).rotate(fx.productId, { retainSec: 86_400 });
    await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    expect((await app.trustBundle()).sequence).toBe(2);
    // The same device later (same storage), when a man in the middle serves the older bundle.
    const later = new LicensingClient({
      config,
      fetch: inProcessFetch as never,
      now: () => t.clock.now().getTime(),
      storage,
    });
    rewrite = (url) => (url.includes("/trust-bundle") ? { body: older, status: 200 } : undefined);
    t.clock.advance(2 * 3600);
    expect((await sdkError(later.heartbeat())).code).toBe("BUNDLE_SEQUENCE_ROLLBACK");
  });
});

describe("signing-key rotation and outages", () => {
  test("a fail-open device that fetched the bundle after a default rotation keeps its network grace through an outage", async () => {
    const open = await runtimeFixture(t, {
      policy: {
        cert_ttl_sec: 86_400,
        heartbeat_sec: 43_200,
        fail_mode: "open",
        network_grace_sec: 3 * 86_400,
      },
    });
    const openConfig = (await t.call("GET", `/mgmt/v1/products/${open.productId}/integration-config`)).body
      .data.config;
    let down = false;
    const app = new LicensingClient({
      config: openConfig,
      fetch: (async (url: string, init?: RequestInit) => {
        if (down) throw new TypeError("fetch failed: the service is unreachable");
        return t.app.handle(new Request(url, init));
      }) as never,
      now: () => t.clock.now().getTime(),
    });
    await app.activate({ licenseKey: open.licenseKey, machineInfo });
    t.clock.advance(60);
    // The certificate's key is retired with the default retention, and the device learns of it.
    new TrustService(t.deps).rotate(open.productId);
    t.clock.advance(2 * 3600);
    await app.serverTime();
    expect((await app.trustBundle()).signing_keys.map((k) => k.status)).toEqual(["retired", "active"]);
    down = true;
    const exp = (await app.licenseInfo()).expiresAt as number;
    for (const [after, state] of [
      [-60, "valid"],
      [3600, "grace"],
      [3 * 86_400 - 60, "grace"],
      [3 * 86_400, "invalid"],
    ] as const) {
      t.clock.advance(exp + after - Math.floor(t.clock.now().getTime() / 1000));
      const info = await app.licenseInfo();
      expect([after, info.state]).toEqual([after, state]);
      if (state === "invalid") expect(info.reason).toBe("expired");
    }
  });
});

describe("a trust bundle the service no longer confirms", () => {
  const DAY = 86_400;
  const blockBundle: Rewrite = (url) =>
    url.includes("/trust-bundle")
      ? { body: JSON.stringify({ error: { code: "INTERNAL", message: "down", details: {} } }), status: 503 }
      : undefined;
  /** The device's own clock: the test clock, put back or forward by `skewMs`. */
  let skewMs = 0;
  const device = (storage = new MemoryStorage()) =>
    new LicensingClient({
      config,
      fetch: inProcessFetch as never,
      now: () => t.clock.now().getTime() + skewMs,
      storage,
    });
  beforeEach(() => {
    skewMs = 0;
  });

  /**
   * Someone holding a leaked product signing key in the middle: the server's real heartbeat
   * answer, re-signed under a delegation of that key, with a certificate of its own making (ten
   * more years, an entitlement the license lacks).
   */
  function forgedWith(leaked: KeyObject, leakedKeyId: string): Rewrite {
    return (url, text, status) => {
      if (!url.includes("/heartbeat") || status !== 200) return blockBundle(url, text, status);
      const genuine = JSON.parse(text);
      const assertion = genuine.response_assertion;
      const claims = JSON.parse(Buffer.from(genuine.data.certificate.split(".")[1], "base64url").toString());
      const certificate = signCompactJws(
        { alg: "EdDSA", kid: leakedKeyId, typ: "service-license+jwt" },
        {
          ...claims,
          exp: claims.exp + 10 * 365 * DAY,
          license: { ...claims.license, entitlements: { pro: true } },
        },
        leaked,
      );
      const online = generateKeyPairSync("ed25519").privateKey;
      const onlinePublic = publicKeyText(createPublicKey(online));
      const delegation = signDelegation(
        {
          v: 1,
          purpose: "runtime-response",
          product_id: fx.productId,
          parent_key_id: leakedKeyId,
          online_key_id: keyIdOf(onlinePublic),
          public_key: onlinePublic,
          issued_at: assertion.server_time - 60,
          expires_at: assertion.server_time + DAY,
        },
        leaked,
      );
      const signer = {
        productId: fx.productId,
        keyId: keyIdOf(onlinePublic),
        parentKeyId: leakedKeyId,
        privateKey: online,
        delegation,
      };
      const body = signedResponseText(signer, {
        requestId: assertion.request_id,
        nonce: assertion.nonce,
        serverTime: assertion.server_time,
        status,
        body: { ...genuine.data, certificate },
      });
      return { body, status };
    };
  }

  test("signed answers are refused with BUNDLE_UNCONFIRMED once the bundle has gone 7 days without a successful refetch, while the stored certificate keeps working", async () => {
    const app = device();
    // The bundle is confirmed while activate() runs, which may cross a second boundary.
    const activatedFrom = Math.floor(t.clock.now().getTime() / 1000);
    await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    const activatedBy = Math.floor(t.clock.now().getTime() / 1000);
    rewrite = blockBundle;
    t.clock.advance(6 * DAY);
    // Confirmed 6 days ago: the cached bundle still stands in for the refetch that fails.
    expect((await app.heartbeat()).licenseStatus).toBe("active");
    t.clock.advance(DAY + 60);
    const serverSide = () =>
      t.deps.sqlite
        .query("SELECT status, last_heartbeat_at AS beat FROM activations ORDER BY activated_at DESC LIMIT 1")
        .get();
    const before = serverSide();
    const refused = await sdkError(app.heartbeat());
    expect(refused.code).toBe("BUNDLE_UNCONFIRMED");
    // Refused before it was sent: the service recorded no check-in the device would not take.
    expect(serverSide()).toEqual(before);
    expect((await sdkError(app.deactivate())).code).toBe("BUNDLE_UNCONFIRMED");
    expect(serverSide()).toEqual(before);
    expect(refused.kind).toBe("verification");
    expect(refused.retryable).toBe(true);
    expect(refused.details).toEqual({ confirmed_at: expect.any(Number), max_unconfirmed_sec: 7 * DAY });
    expect(refused.details.confirmed_at).toBeGreaterThanOrEqual(activatedFrom);
    expect(refused.details.confirmed_at).toBeLessThanOrEqual(activatedBy);
    expect((refused.cause as SdkError).status).toBe(503);
    await sdkError(app.serverTime());
    // An outage does not make a licensed device fail closed: the offline state is untouched.
    expect(await app.licenseState()).toBe("valid");
    rewrite = undefined;
    expect((await app.heartbeat()).licenseStatus).toBe("active");
    rewrite = blockBundle;
    t.clock.advance(6 * DAY);
    expect((await app.heartbeat()).licenseStatus).toBe("active");
  });

  test("answers forged with a leaked signing key, declared compromised since, are refused once the device's bundle has gone unconfirmed too long, though the bundle is blocked", async () => {
    const app = device();
    await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    const leakedKeyId = (await app.trustBundle()).signing_keys[0]?.key_id as string;
    const trust = new TrustService(t.deps);
    trust.rotate(fx.productId);
    trust.retire(leakedKeyId, { compromised: true });
    const leaked = privateKeyFromPkcs8(t.deps.keystore.secret(productSigningEntryId(leakedKeyId)));
    rewrite = forgedWith(leaked, leakedKeyId);
    t.clock.advance(7 * DAY + 60);
    expect((await sdkError(app.heartbeat())).code).toBe("BUNDLE_UNCONFIRMED");
    const info = await app.licenseInfo();
    expect(info.entitlements.pro).toBeUndefined();
    expect(info.expiresAt).toBeLessThan(Math.floor(t.clock.now().getTime() / 1000) + 365 * DAY);
    // Once the bundle gets through, the key shows as compromised.
    const forge = rewrite;
    rewrite = (url, text, status) => (url.includes("/trust-bundle") ? undefined : forge(url, text, status));
    expect((await sdkError(app.heartbeat())).code).toBe("KEY_COMPROMISED");
    expect((await app.trustBundle()).sequence).toBe(3);
  });

  test("a bundle stored by an older SDK, without a confirmation time, counts as never confirmed: the next answer refetches it first", async () => {
    const storage = new MemoryStorage();
    await device(storage).activate({ licenseKey: fx.licenseKey, machineInfo });
    const key = `svc.v1.live.${fx.productId}.bundle`;
    const stored = JSON.parse((await storage.get(key)) as string);
    expect(typeof stored.confirmed_at_ms).toBe("number");
    delete stored.confirmed_at_ms;
    await storage.set(key, JSON.stringify(stored));
    const upgraded = device(storage);
    rewrite = blockBundle;
    const refused = await sdkError(upgraded.heartbeat());
    expect(refused.code).toBe("BUNDLE_UNCONFIRMED");
    expect(refused.details.confirmed_at).toBeNull();
    expect(await upgraded.licenseState()).toBe("valid");
    rewrite = undefined;
    const before = t.clock.now().getTime();
    await upgraded.heartbeat();
    expect(JSON.parse((await storage.get(key)) as string).confirmed_at_ms).toBeGreaterThanOrEqual(before);
  });

  test("putting the device's clock back does not make an old confirmation look recent", async () => {
    const app = device();
    await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    rewrite = blockBundle;
    t.clock.advance(8 * DAY);
    await app.licenseInfo(); // the device sees its clock at 8 days on
    skewMs = -7 * DAY * 1000;
    expect((await sdkError(app.heartbeat())).code).toBe("BUNDLE_UNCONFIRMED");
  });
});
