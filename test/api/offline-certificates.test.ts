import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { zipSync } from "fflate";
import { importJWK, jwtVerify } from "jose";
import { b64u, sha256Hex } from "../../src/crypto/encoding.ts";
import { TrustService } from "../../src/modules/trust/service.ts";
import { createOfflineRequest, LicensingClient } from "../../src/sdk/index.ts";
import { readStoredZip } from "../../src/sdk/zip.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, requestPackage, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/** POST /mgmt/v1/licenses/{id}/offline-certificates, with the SDK as the device. */
let t: TestContext;
let fx: RuntimeFixture;
let config: Record<string, unknown>;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { validation_mode: "offline", max_machines: 2, entitlements: { pro: true } },
    license: { expires_at: new Date(t.clock.now().getTime() + 90 * 86_400_000).toISOString() },
  });
  config = await integrationConfig(t, fx.productId);
});
afterEach(() => t.close());

const device = () => sdkClient(t, config);
const auditTypes = () =>
  t.deps.sqlite
    .query<{ type: string }, []>("SELECT type FROM audit_events ORDER BY id")
    .all()
    .map((row) => row.type);

describe("issuing a package", () => {
  test("a device's request gets a ZIP that unzip accepts, jose verifies its license.jwt, and the SDK loads it", async () => {
    const app = device();
    const request = await app.createOfflineRequest({ machineInfo: MACHINE });
    const response = await requestPackage(t, fx.licenseId, request);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("application/vnd.service.offline+zip");

    const dir = mkdtempSync(join(tmpdir(), "offline-zip-"));
    try {
      writeFileSync(join(dir, "package.zip"), response.bytes);
      const unzip = spawnSync("unzip", ["-t", join(dir, "package.zip")], { encoding: "utf8" });
      expect(unzip.error, "unzip must be installed (.ci/run installs it)").toBeUndefined();
      expect(unzip.status).toBe(0);
      expect(unzip.stdout).toContain("No errors detected");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }

    const entries = readStoredZip(response.bytes, [
      "manifest.json",
      "manifest.sig",
      "license.jwt",
      "trust-bundle.json",
    ]);
    const jwt = new TextDecoder().decode(entries.get("license.jwt"));
    const kid = JSON.parse(Buffer.from(jwt.split(".")[0] ?? "", "base64url").toString()).kid;
    const key = fx.bundle.signing_keys.find((k) => k.key_id === kid);
    const publicKey = await importJWK({ kty: "OKP", crv: "Ed25519", x: key?.public_key.slice(8) }, "EdDSA");
    const { payload } = await jwtVerify(jwt, publicKey, {
      audience: fx.productId,
      subject: fx.licenseId,
      typ: "service-license+jwt",
    });
    const manifest = JSON.parse(new TextDecoder().decode(entries.get("manifest.json")));
    expect(payload.exp).toBe(manifest.expires_at);
    expect(payload.heartbeat).toEqual({ required: false, interval_sec: expect.any(Number), grace_sec: 0 });

    const loaded = await app.loadOfflinePackage(response.bytes);
    expect(loaded.licenseId).toBe(fx.licenseId);
    expect(await app.licenseState()).toBe("valid");
    expect(await app.hasEntitlement("pro")).toBe(true);
  });

  test("the manifest binds both device keys and hashes the other entries; every entry has the fixed timestamp", async () => {
    const app = device();
    const keys = await app.deviceKeys();
    const response = await requestPackage(
      t,
      fx.licenseId,
      await app.createOfflineRequest({ machineInfo: MACHINE }),
    );
    const entries = readStoredZip(response.bytes, [
      "manifest.json",
      "manifest.sig",
      "license.jwt",
      "trust-bundle.json",
    ]);
    const manifest = JSON.parse(new TextDecoder().decode(entries.get("manifest.json")));
    expect(manifest).toMatchObject({
      format: "service-offline-package-v1",
      product_id: fx.productId,
      license_id: fx.licenseId,
      assignment_id: null,
      device_signing_key_thumbprint: sha256Hex(keys.signing.publicKey),
      device_kem_key_thumbprint: sha256Hex(keys.kem.publicKey),
    });
    expect(manifest.files).toEqual({
      "license.jwt": sha256Hex(entries.get("license.jwt") ?? new Uint8Array()),
      "trust-bundle.json": sha256Hex(entries.get("trust-bundle.json") ?? new Uint8Array()),
    });
    // DOS time 00:00:00 and date 1980-01-01 in every local header, whatever the time zone.
    const view = new DataView(response.bytes.buffer, response.bytes.byteOffset);
    let at = 0;
    const names: string[] = [];
    while (view.getUint32(at, true) === 0x04034b50) {
      expect([view.getUint16(at + 10, true), view.getUint16(at + 12, true)]).toEqual([0, 0x21]);
      const nameLength = view.getUint16(at + 26, true);
      names.push(new TextDecoder().decode(response.bytes.subarray(at + 30, at + 30 + nameLength)));
      at += 30 + nameLength + view.getUint32(at + 18, true);
    }
    expect(names).toEqual(["manifest.json", "manifest.sig", "license.jwt", "trust-bundle.json"]);
  });

  test("the package expires with the license by default, or when asked, never after the license", async () => {
    const app = device();
    const license = (await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}`)).body.data;
    const first = await requestPackage(
      t,
      fx.licenseId,
      await app.createOfflineRequest({ machineInfo: MACHINE }),
    );
    expect((await app.loadOfflinePackage(first.bytes)).expiresAt).toBe(
      Math.floor(Date.parse(license.expires_at) / 1000),
    );
    const asked = new Date(t.clock.now().getTime() + 30 * 86_400_000);
    asked.setUTCMilliseconds(0);
    const second = await requestPackage(
      t,
      fx.licenseId,
      await app.createOfflineRequest({ machineInfo: MACHINE }),
      {
        expires_at: asked.toISOString(),
      },
    );
    expect((await app.loadOfflinePackage(second.bytes)).expiresAt).toBe(asked.getTime() / 1000);
    const late = await requestPackage(
      t,
      fx.licenseId,
      await app.createOfflineRequest({ machineInfo: MACHINE }),
      {
        expires_at: new Date(Date.parse(license.expires_at) + 1000).toISOString(),
      },
    );
    expect(late.status).toBe(422);
    expect(late.error.details.errors.expires_at).toEqual(["must not be after the license's expires_at"]);
  });

  test("each issuance is audited with the actor; a repeated identical request is not a new issuance", async () => {
    const request = await device().createOfflineRequest({ machineInfo: MACHINE });
    await requestPackage(t, fx.licenseId, request);
    await requestPackage(t, fx.licenseId, request);
    expect(auditTypes().filter((type) => type === "license.offline_package_issued")).toHaveLength(1);
    const event = (await t.call("GET", "/mgmt/v1/events")).body.data[0];
    expect(event).toMatchObject({
      type: "license.offline_package_issued",
      target: { type: "license", id: fx.licenseId },
    });
    expect(event.actor.type).toBe("api_key");
    expect(event.data.package_id).toMatch(/^olp_/);
  });
});

describe("repeating a request", () => {
  test("an identical request answers the same bytes; a new request from the same device gets a new package", async () => {
    const app = device();
    const request = await app.createOfflineRequest({ machineInfo: MACHINE });
    const first = await requestPackage(t, fx.licenseId, request);
    t.clock.advance(3600);
    const again = await requestPackage(t, fx.licenseId, request);
    expect(again.status).toBe(200);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(Buffer.from(again.bytes).equals(Buffer.from(first.bytes))).toBe(true);
    const fresh = await requestPackage(
      t,
      fx.licenseId,
      await app.createOfflineRequest({ machineInfo: MACHINE }),
    );
    expect(Buffer.from(fresh.bytes).equals(Buffer.from(first.bytes))).toBe(false);
    const activations = (await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}/activations`)).body.data;
    expect(activations).toHaveLength(1);
  });

  test("the stored package is answered even after the request is too old for a new one", async () => {
    const request = await device().createOfflineRequest({ machineInfo: MACHINE });
    const first = await requestPackage(t, fx.licenseId, request);
    t.clock.advance(8 * 86_400);
    const again = await requestPackage(t, fx.licenseId, request);
    expect(again.status).toBe(200);
    expect(Buffer.from(again.bytes).equals(Buffer.from(first.bytes))).toBe(true);
  });

  test.each([
    ["package_expired", async (_t: TestContext) => _t.clock.advance(31 * 86_400)],
    [
      "device_deactivated",
      async (_t: TestContext) => {
        const [activation] = (await _t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}/activations`)).body
          .data;
        await _t.call("DELETE", `/mgmt/v1/activations/${activation.id}`);
      },
    ],
    [
      "signing_key_rotated",
      async (_t: TestContext) => new TrustService(_t.deps).rotate(fx.productId, { retainSec: 86_400 }),
    ],
  ])(
    "once the package is no longer valid (%s) the identical request answers 409 OFFLINE_REQUEST_USED",
    async (reason, change) => {
      const request = await device().createOfflineRequest({ machineInfo: MACHINE });
      const expiresAt = new Date(t.clock.now().getTime() + 30 * 86_400_000).toISOString();
      expect((await requestPackage(t, fx.licenseId, request, { expires_at: expiresAt })).status).toBe(200);
      await change(t);
      const again = await requestPackage(t, fx.licenseId, request, { expires_at: expiresAt });
      expect(again.status).toBe(409);
      expect(again.error).toMatchObject({ code: "OFFLINE_REQUEST_USED", details: { reason } });
    },
  );

  const patchLicense = (body: Record<string, unknown>) =>
    t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body });
  const inDays = (days: number) => new Date(t.clock.now().getTime() + days * 86_400_000).toISOString();

  test.each([
    ["its expiry shortened to before the package's", () => ({ expires_at: inDays(10) })],
    ["its expiry extended", () => ({ expires_at: inDays(200) })],
    ["an entitlement taken away", () => ({ entitlements: { pro: false } })],
    ["a max_concurrent override", () => ({ max_concurrent_override: 1 })],
  ])(
    "the identical request after the license changed (%s) answers 409 license_changed, never the stored package",
    async (_change, body) => {
      const request = await device().createOfflineRequest({ machineInfo: MACHINE });
      const first = await requestPackage(t, fx.licenseId, request);
      expect(first.status).toBe(200);
      expect((await patchLicense(body())).status).toBe(200);
      const again = await requestPackage(t, fx.licenseId, request);
      expect([again.status, again.headers.get("idempotent-replayed")]).toEqual([409, null]);
      expect(again.error).toMatchObject({
        code: "OFFLINE_REQUEST_USED",
        details: { reason: "license_changed", package_id: first.headers.get("x-offline-package-id") },
      });
    },
  );

  test("a shortened license never gets a package past its new expiry, replayed or new", async () => {
    const request = await device().createOfflineRequest({ machineInfo: MACHINE });
    expect((await requestPackage(t, fx.licenseId, request)).status).toBe(200);
    const shortened = inDays(1);
    expect((await patchLicense({ expires_at: shortened })).status).toBe(200);
    expect((await requestPackage(t, fx.licenseId, request)).error.details.reason).toBe("license_changed");
    const fresh = await requestPackage(
      t,
      fx.licenseId,
      await device().createOfflineRequest({ machineInfo: MACHINE }),
    );
    const manifest = JSON.parse(
      new TextDecoder().decode(
        readStoredZip(fresh.bytes, ["manifest.json", "manifest.sig", "license.jwt", "trust-bundle.json"]).get(
          "manifest.json",
        ),
      ),
    );
    expect(manifest.expires_at).toBe(Math.floor(Date.parse(shortened) / 1000));
  });

  test("a license change the certificate does not state (metadata, a suspension lifted) still answers the stored bytes", async () => {
    const request = await device().createOfflineRequest({ machineInfo: MACHINE });
    const first = await requestPackage(t, fx.licenseId, request);
    expect((await patchLicense({ metadata: { crm: "42" } })).status).toBe(200);
    expect((await patchLicense({ status_action: "suspended" })).status).toBe(200);
    expect((await requestPackage(t, fx.licenseId, request)).error.code).toBe("LICENSE_SUSPENDED");
    expect((await patchLicense({ status_action: "active" })).status).toBe(200);
    const again = await requestPackage(t, fx.licenseId, request);
    expect([again.status, again.headers.get("idempotent-replayed")]).toEqual([200, "true"]);
    expect(Buffer.from(again.bytes).equals(Buffer.from(first.bytes))).toBe(true);
  });

  test.each([
    ["not a ZIP", (_body: Uint8Array) => new Uint8Array([0, 1, 2, 3])],
    ["cut short", (body: Uint8Array) => body.slice(0, Math.floor(body.length / 2))],
    [
      "a ZIP without license.jwt",
      (_body: Uint8Array) => zipSync({ "manifest.json": new Uint8Array([123, 125]) }),
    ],
  ])(
    "a stored package that is damaged (%s) is never handed out: the identical request answers 409 package_unreadable",
    async (_damage, damage) => {
      const request = await device().createOfflineRequest({ machineInfo: MACHINE });
      const first = await requestPackage(t, fx.licenseId, request);
      expect(first.status).toBe(200);
      const id = first.headers.get("x-offline-package-id");
      t.deps.sqlite.run("UPDATE offline_packages SET body = ? WHERE id = ?", [damage(first.bytes), id]);
      const again = await requestPackage(t, fx.licenseId, request);
      expect([again.status, again.headers.get("idempotent-replayed")]).toEqual([409, null]);
      expect(again.error).toMatchObject({
        code: "OFFLINE_REQUEST_USED",
        details: { reason: "package_unreadable", package_id: id },
      });
      const fresh = await requestPackage(
        t,
        fx.licenseId,
        await device().createOfflineRequest({ machineInfo: MACHINE }),
      );
      expect(fresh.status).toBe(200);
    },
  );

  test("the identical request with another expires_at answers 409 options_differ", async () => {
    const request = await device().createOfflineRequest({ machineInfo: MACHINE });
    await requestPackage(t, fx.licenseId, request);
    const other = await requestPackage(t, fx.licenseId, request, {
      expires_at: new Date(t.clock.now().getTime() + 86_400_000).toISOString(),
    });
    expect(other.error).toMatchObject({
      code: "OFFLINE_REQUEST_USED",
      details: { reason: "options_differ" },
    });
  });
});

describe("refusals", () => {
  const fields = async (
    mutate: (request: Record<string, unknown>) => void,
    extra: Record<string, unknown> = {},
  ) => {
    const request = (await device().createOfflineRequest({ machineInfo: MACHINE })) as unknown as Record<
      string,
      unknown
    >;
    mutate(request);
    const response = await requestPackage(t, fx.licenseId, request, extra);
    expect(response.status).toBe(422);
    expect(response.error.code).toBe("VALIDATION_FAILED");
    return Object.keys(response.error.details.errors);
  };

  test("a request whose proof does not match its content answers 422 on device_proof", async () => {
    expect(await fields((r) => ((r.machine_info as Record<string, unknown>).hostname = "other"))).toEqual([
      "request.device_proof",
    ]);
    expect(await fields((r) => (r.device_proof = b64u.encode(new Uint8Array(64))))).toEqual([
      "request.device_proof",
    ]);
  });

  test("a request for another product, a KEM key that is not P-256, or a bad format answers 422 on that field", async () => {
    const app = device();
    const forOther = createOfflineRequest(await app.deviceKeys(), {
      productId: "prod_01M81Z00000000000000000000",
      machineInfo: MACHINE,
      generatedAt: Math.floor(t.clock.now().getTime() / 1000),
      nonce: "n".repeat(22),
    });
    const other = await requestPackage(t, fx.licenseId, forOther);
    expect(Object.keys(other.error.details.errors)).toEqual(["request.product_id"]);
    expect(await fields((r) => (r.device_kem_public_key = r.device_signing_public_key))).toEqual([
      "request.device_kem_public_key",
    ]);
    expect(await fields((r) => (r.format = "service-offline-request-v2"))).toEqual(["request.format"]);
    expect(await fields((r) => (r.extra = 1))).toEqual(["request.extra"]);
  });

  test("a request older than 7 days or more than 300 s ahead of the server answers 422 on generated_at", async () => {
    // 301 s ahead must stay 301 s ahead: a second ticking over while the request is signed and
    // sent would make it 300.
    t.clock.freeze();
    const ahead = new LicensingClient({ config, now: () => t.clock.now().getTime() + 301_000 });
    const future = await requestPackage(
      t,
      fx.licenseId,
      await ahead.createOfflineRequest({ machineInfo: MACHINE }),
    );
    expect(Object.keys(future.error.details.errors)).toEqual(["request.generated_at"]);
    const old = await device().createOfflineRequest({ machineInfo: MACHINE });
    t.clock.advance(7 * 86_400 + 1);
    const stale = await requestPackage(t, fx.licenseId, old);
    expect(Object.keys(stale.error.details.errors)).toEqual(["request.generated_at"]);
  });

  test("an expires_at in the past or malformed, or an assignment on a device license, answers 422", async () => {
    expect(
      await fields(() => {}, { expires_at: new Date(t.clock.now().getTime() - 1000).toISOString() }),
    ).toEqual(["expires_at"]);
    expect(await fields(() => {}, { expires_at: "2030-02-31T00:00:00Z" })).toEqual(["expires_at"]);
    expect(await fields(() => {}, { license_assignment_id: "asg_1" })).toEqual(["license_assignment_id"]);
  });

  test("an online-only policy answers 422 OFFLINE_PACKAGE_NOT_ALLOWED; hybrid and unmanaged perpetual are allowed", async () => {
    for (const [policy, status] of [
      [{ validation_mode: "online" }, 422],
      [{ validation_mode: "hybrid" }, 200],
      [{ perpetual_mode: "unmanaged" }, 200],
    ] as const) {
      const other = await runtimeFixture(t, { policy });
      const app = sdkClient(t, await integrationConfig(t, other.productId));
      const response = await requestPackage(
        t,
        other.licenseId,
        await app.createOfflineRequest({ machineInfo: MACHINE }),
      );
      expect([policy, response.status, response.error?.code]).toEqual([
        policy,
        status,
        status === 422 ? "OFFLINE_PACKAGE_NOT_ALLOWED" : undefined,
      ]);
    }
  });

  test("a revoked, suspended or expired license, and a blocked device, are refused with the runtime's codes", async () => {
    const request = async () => device().createOfflineRequest({ machineInfo: MACHINE });
    await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body: { status_action: "suspended" } });
    expect((await requestPackage(t, fx.licenseId, await request())).error.code).toBe("LICENSE_SUSPENDED");
    await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body: { status_action: "active" } });
    const app = device();
    const blocked = await app.createOfflineRequest({ machineInfo: MACHINE });
    await t.call("POST", "/mgmt/v1/device-blocks", {
      body: {
        kind: "device_key",
        device_signing_key_thumbprint: sha256Hex((await app.deviceKeys()).signing.publicKey),
      },
    });
    expect((await requestPackage(t, fx.licenseId, blocked)).error.code).toBe("DEVICE_BLOCKED");
    t.clock.advance(91 * 86_400);
    expect((await requestPackage(t, fx.licenseId, await request())).error.code).toBe("LICENSE_EXPIRED");
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    const revoked = await requestPackage(t, fx.licenseId, await request());
    expect([revoked.status, revoked.error.code]).toEqual([403, "LICENSE_REVOKED"]);
    expect(revoked.error.response_assertion).toBeUndefined();
  });

  test("a package takes a machine slot: a third device answers 409 MACHINE_LIMIT_REACHED", async () => {
    for (const expected of [200, 200, 409]) {
      const response = await requestPackage(
        t,
        fx.licenseId,
        await device().createOfflineRequest({ machineInfo: MACHINE }),
      );
      expect(response.status).toBe(expected);
      if (expected === 409) expect(response.error.code).toBe("MACHINE_LIMIT_REACHED");
    }
  });

  test("another environment's key and an unknown license answer 404", async () => {
    const request = await device().createOfflineRequest({ machineInfo: MACHINE });
    expect((await requestPackage(t, fx.licenseId, request, {}, t.keys.test)).status).toBe(404);
    expect((await requestPackage(t, "lic_01M81Z00000000000000000000", request)).status).toBe(404);
  });
});
