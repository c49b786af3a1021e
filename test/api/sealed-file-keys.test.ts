import { afterAll, afterEach, beforeEach, describe, expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { b64u } from "../../src/crypto/encoding.ts";
import { keyIdOf, publicKeyText } from "../../src/crypto/keys.ts";
import {
  newSealedHeader,
  parseSealingKeyLine,
  SEALED_CHUNK_SIZE,
  sealFile,
} from "../../src/crypto/sealed-file.ts";
import { hpkeOpen } from "../../src/sdk/hpke.ts";
import type { LicensingClient } from "../../src/sdk/index.ts";
import { TestDevice } from "../support/device.ts";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal, sdkClient } from "../support/offline.ts";
import { activatedDevice, proofCall, type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/** POST /runtime/v1/activations/{id}/sealed-file-keys, and the SDK opening what the tool sealed. */
const dir = mkdtempSync(join(tmpdir(), "sealed-keys-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let t: TestContext;
let fx: RuntimeFixture;
let sealingKey: string;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, { policy: { max_machines: 10, entitlements: { pro: true, beta: false } } });
  sealingKey = (await t.call("POST", `/mgmt/v1/products/${fx.productId}/sealed-files`)).body.data.current_key
    .sealing_key;
});
afterEach(() => t.close());

const pattern = (size: number) => new Uint8Array(size).map((_, i) => (i * 13 + 5) % 256);

async function sealed(plain: Uint8Array, options: { entitlement?: string; key?: string } = {}) {
  const input = join(dir, `in-${Math.random()}`);
  writeFileSync(input, plain);
  const entitlement = options.entitlement === undefined ? {} : { entitlement: options.entitlement };
  await sealFile(input, `${input}.sealed`, parseSealingKeyLine(options.key ?? sealingKey), entitlement);
  return new Uint8Array(readFileSync(`${input}.sealed`));
}

const headerLine = (file: Uint8Array) => new TextDecoder().decode(file.subarray(9, file.indexOf(0x0a, 9)));

async function activatedApp(fixture = fx): Promise<LicensingClient> {
  const app = sdkClient(t, await integrationConfig(t, fixture.productId));
  await app.activate({ licenseKey: fixture.licenseKey, machineInfo: MACHINE });
  return app;
}

async function plaintext(app: LicensingClient, file: Uint8Array) {
  const opened = await app.openSealedFile(file);
  return new Uint8Array(await new Response(opened.stream).arrayBuffer());
}

const keyPath = (activationId: string) => `/runtime/v1/activations/${activationId}/sealed-file-keys`;
const runtimeEventCount = () =>
  t.deps.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM runtime_events").get()?.n;

describe("a sealed file opens on a licensed device and on no other", () => {
  test("a file larger than a chunk, sealed by the tool, opens byte for byte on a licensed device", async () => {
    const plain = pattern(3 * SEALED_CHUNK_SIZE + 777);
    const app = await activatedApp();
    expect(await plaintext(app, await sealed(plain, { entitlement: "pro" }))).toEqual(plain);
  });

  test("the key answer is a signed envelope naming the file and header, sealed to this activation's KEM key only", async () => {
    const file = await sealed(pattern(10));
    const { device, activationId } = await activatedDevice(t, fx);
    const response = await proofCall(t, device, "POST", keyPath(activationId), activationId, {
      header: headerLine(file),
    });
    expect(response.status).toBe(200);
    expect(response.body.response_assertion.status).toBe(200);
    expect(response.body.data).toMatchObject({ activation_id: activationId, file_id: expect.any(String) });
    expect(b64u.decode(response.body.data.wrapped_key)).toHaveLength(48);
    // Another device's KEM key cannot open it.
    const other = generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey.export({ format: "jwk" });
    await expect(
      hpkeOpen(
        b64u.decode(other.d ?? ""),
        b64u.decode(response.body.data.enc),
        b64u.decode(response.body.data.wrapped_key),
        "Service-Sealed-File-v1 device",
        "x",
      ),
    ).rejects.toThrow();
  });

  test("a device of a license without the file's entitlement gets 403 SEALED_FILE_ENTITLEMENT_REQUIRED", async () => {
    const app = await activatedApp();
    for (const entitlement of ["beta", "missing"]) {
      const error = await refusal(app.openSealedFile(await sealed(pattern(10), { entitlement })));
      expect([error.kind, error.code, error.details.entitlement]).toEqual([
        "server",
        "SEALED_FILE_ENTITLEMENT_REQUIRED",
        entitlement,
      ]);
    }
  });

  test("a device of another product gets SEALED_FILE_INVALID wrong_product; an unactivated app cannot ask", async () => {
    const other = await runtimeFixture(t);
    const app = await activatedApp(other);
    const error = await refusal(app.openSealedFile(await sealed(pattern(10))));
    expect([error.code, error.details.reason]).toEqual(["SEALED_FILE_INVALID", "wrong_product"]);
    const fresh = sdkClient(t, await integrationConfig(t, fx.productId));
    expect((await refusal(fresh.openSealedFile(await sealed(pattern(10))))).code).toBe("NOT_ACTIVATED");
  });

  test("an altered key answer is refused before use, and a flipped payload byte after the key is released", async () => {
    const file = await sealed(pattern(2 * SEALED_CHUNK_SIZE));
    const app = sdkClient(t, await integrationConfig(t, fx.productId), {
      fetch: (async (url: string, init?: RequestInit) => {
        const response = await t.app.handle(new Request(url, init));
        if (!url.includes("/sealed-file-keys") || response.status !== 200) return response;
        const body = await response.json();
        const wrapped = b64u.decode(body.data.wrapped_key);
        wrapped[0] = (wrapped[0] ?? 0) ^ 1;
        body.data.wrapped_key = b64u.encode(wrapped);
        return new Response(JSON.stringify(body), { status: 200, headers: response.headers });
      }) as typeof fetch,
    });
    await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
    expect((await refusal(app.openSealedFile(file))).code).toBe("BODY_HASH_MISMATCH");
    const honest = await activatedApp();
    const damaged = file.slice();
    damaged[damaged.length - 100] = (damaged[damaged.length - 100] ?? 0) ^ 1;
    const opened = await honest.openSealedFile(damaged);
    const error = await refusal(new Response(opened.stream).arrayBuffer());
    expect([error.code, error.details.chunk]).toEqual(["SEALED_FILE_TAMPERED", 1]);
  });

  /** An activated app whose key requests are counted. */
  async function countingApp() {
    const counted = { calls: 0 };
    const app = sdkClient(t, await integrationConfig(t, fx.productId), {
      fetch: ((url: string, init?: RequestInit) => {
        if (url.includes("/sealed-file-keys")) counted.calls++;
        return t.app.handle(new Request(url, init));
      }) as typeof fetch,
    });
    await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
    return { app, counted };
  }

  test("the key is asked for once per file and device, then opened from the cache", async () => {
    const { app, counted } = await countingApp();
    const file = await sealed(pattern(100));
    expect(await plaintext(app, file)).toEqual(pattern(100));
    expect(await plaintext(app, file)).toEqual(pattern(100));
    expect(counted.calls).toBe(1);
  });

  test("a cached key is not used once the device holds a signed revocation: the service is asked, and its denial comes back", async () => {
    const { app, counted } = await countingApp();
    const file = await sealed(pattern(100));
    expect(await plaintext(app, file)).toEqual(pattern(100));
    expect((await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`)).status).toBe(204);
    expect(await refusal(app.heartbeat())).toMatchObject({ code: "LICENSE_REVOKED", kind: "license" });
    expect(await refusal(plaintext(app, file))).toMatchObject({ code: "LICENSE_REVOKED", kind: "license" });
    expect(counted.calls).toBe(2);
  });
});

describe("every cause of SEALED_FILE_INVALID", () => {
  async function ask(header: string, device?: TestDevice, activationId?: string) {
    const target = device && activationId ? { device, activationId } : await activatedDevice(t, fx);
    return proofCall(t, target.device, "POST", keyPath(target.activationId), target.activationId, { header });
  }
  const reasonOf = (response: Awaited<ReturnType<typeof ask>>) => [
    response.status,
    response.body.error.code,
    response.body.error.details.reason,
  ];

  test("flipping any byte of the header line is refused, never answered with a key", async () => {
    const line = headerLine(await sealed(pattern(10)));
    const { device, activationId } = await activatedDevice(t, fx);
    const reasons = new Set<string>();
    for (let at = 0; at < line.length; at++) {
      const flipped = line.slice(0, at) + String.fromCharCode(line.charCodeAt(at) ^ 1) + line.slice(at + 1);
      const response = await ask(flipped, device, activationId);
      expect(`${at}:${response.status}:${response.body.error?.code}`).toBe(`${at}:422:SEALED_FILE_INVALID`);
      reasons.add(response.body.error.details.reason);
    }
    expect([...reasons].sort()).toEqual(["invalid_header", "unknown_key", "unwrap_failed", "wrong_product"]);
  });

  test("a wrapped key or enc taken from another file does not open: unwrap_failed", async () => {
    const a = JSON.parse(headerLine(await sealed(pattern(10))));
    const b = JSON.parse(headerLine(await sealed(pattern(10))));
    const canonical = (h: Record<string, unknown>) =>
      JSON.stringify(Object.fromEntries(Object.entries(h).sort(([x], [y]) => (x < y ? -1 : 1))));
    expect(reasonOf(await ask(canonical({ ...a, wrapped_key: b.wrapped_key })))).toEqual([
      422,
      "SEALED_FILE_INVALID",
      "unwrap_failed",
    ]);
    expect(reasonOf(await ask(canonical({ ...a, enc: b.enc })))).toEqual([
      422,
      "SEALED_FILE_INVALID",
      "unwrap_failed",
    ]);
  });

  test("a key this product does not have is unknown_key; a retired or compromised one is refused by name", async () => {
    const stray = generateKeyPairSync("ec", { namedCurve: "P-256" }).publicKey;
    const text = publicKeyText(stray);
    const { line } = await newSealedHeader({
      productId: fx.productId,
      keyId: keyIdOf(text),
      point: b64u.decode(text.slice(5)),
    });
    expect(reasonOf(await ask(line))).toEqual([422, "SEALED_FILE_INVALID", "unknown_key"]);
    const file = headerLine(await sealed(pattern(10)));
    for (const status of ["retired", "compromised"]) {
      t.deps.sqlite.run("UPDATE sealing_keys SET status = ? WHERE product_id = ?", [status, fx.productId]);
      expect(reasonOf(await ask(file))).toEqual([422, "SEALED_FILE_INVALID", `${status}_key`]);
    }
  });

  test("an activation whose KEM key is not P-256 is device_kem_key_invalid", async () => {
    const device = new TestDevice();
    const activation = factories(t).activation({
      productId: fx.productId,
      licenseId: fx.licenseId,
      deviceSigningKey: device.signingPublic,
      deviceThumbprint: device.thumbprint,
      deviceKemKey: device.signingPublic,
    });
    const file = headerLine(await sealed(pattern(10)));
    expect(reasonOf(await ask(file, device, activation.id))).toEqual([
      422,
      "SEALED_FILE_INVALID",
      "device_kem_key_invalid",
    ]);
  });

  test("a header line over 4096 bytes, however far over, is invalid_header (field header); the limit counts UTF-8 bytes", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const tooLong = ["x".repeat(4097), "é".repeat(2049), "x".repeat(15_000)];
    for (const header of tooLong) {
      const response = await ask(header, device, activationId);
      expect({
        bytes: Buffer.byteLength(header),
        status: response.status,
        error: response.body.error,
      }).toMatchObject({
        bytes: Buffer.byteLength(header),
        status: 422,
        error: { code: "SEALED_FILE_INVALID", details: { reason: "invalid_header", field: "header" } },
      });
      expect(response.body.error.message).toContain("too long");
    }
    // Exactly 4096 bytes is within the limit: refused for what it is, not for its length.
    const atLimit = await ask("é".repeat(2048), device, activationId);
    expect(atLimit.body.error.details).toEqual({ reason: "invalid_header", field: "header" });
    expect(atLimit.body.error.message).toContain("is not JSON");
    // The runtime body limit still applies before any of this.
    expect((await ask("x".repeat(16 * 1024), device, activationId)).status).toBe(413);
  });

  test("junk instead of a header is invalid_header naming the part", async () => {
    const response = await ask("{}");
    expect(reasonOf(response)).toEqual([422, "SEALED_FILE_INVALID", "invalid_header"]);
    expect(response.body.error.details.field).toBe("v");
  });
});

describe("license state, plan and environment come first", () => {
  test("revoked, suspended and expired licenses get the signed 403s, which the SDK takes as authentic", async () => {
    const file = await sealed(pattern(10));
    const app = await activatedApp();
    await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body: { status_action: "suspended" } });
    const suspended = await refusal(app.openSealedFile(file));
    expect([suspended.kind, suspended.code]).toEqual(["license", "LICENSE_SUSPENDED"]);
    await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, {
      body: { status_action: "active", expires_at: new Date(t.clock.now().getTime() + 60_000).toISOString() },
    });
    t.clock.advance(120);
    expect((await refusal(app.openSealedFile(file))).code).toBe("LICENSE_EXPIRED");
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    const revoked = await refusal(app.openSealedFile(file));
    expect([revoked.kind, revoked.code, revoked.status]).toEqual(["license", "LICENSE_REVOKED", 403]);
  });

  test("a plan without sealed files gets 403 PLAN_ENTITLEMENT_REQUIRED naming sealed_files", async () => {
    const file = await sealed(pattern(10));
    const app = await activatedApp();
    t.workspace.setPlan("personal", { type: "system" });
    const error = await refusal(app.openSealedFile(file));
    expect([error.code, error.status, error.details.entitlement]).toEqual([
      "PLAN_ENTITLEMENT_REQUIRED",
      403,
      "sealed_files",
    ]);
  });

  test("a deactivated device gets the signed 410, a bad proof 401, an unknown activation 404", async () => {
    const line = headerLine(await sealed(pattern(10)));
    const { device, activationId } = await activatedDevice(t, fx);
    const other = new TestDevice();
    expect(
      (await proofCall(t, other, "POST", keyPath(activationId), activationId, { header: line })).status,
    ).toBe(401);
    const unknown = "act_01M81Z00000000000000000000";
    expect((await proofCall(t, device, "POST", keyPath(unknown), unknown, { header: line })).status).toBe(
      404,
    );
    await t.call("DELETE", `/mgmt/v1/activations/${activationId}`);
    const gone = await proofCall(t, device, "POST", keyPath(activationId), activationId, { header: line });
    expect([gone.status, gone.body.error.code, gone.body.response_assertion?.status]).toEqual([
      410,
      "ACTIVATION_DEACTIVATED",
      410,
    ]);
  });

  test("a device whose slot was taken while it was silent is culled (signed 410) and gets no key; the device in its slot does", async () => {
    const oneMachine = await runtimeFixture(t, {
      policy: { max_machines: 1, heartbeat_required: true, heartbeat_sec: 3600, network_grace_sec: 7200 },
    });
    const key = (await t.call("POST", `/mgmt/v1/products/${oneMachine.productId}/sealed-files`)).body.data
      .current_key.sealing_key;
    const line = headerLine(await sealed(pattern(10), { key }));
    const stale = await activatedDevice(t, oneMachine);
    t.clock.advance(3600 + 7200 + 1);
    const fresh = await activatedDevice(t, oneMachine);
    const refused = await proofCall(
      t,
      stale.device,
      "POST",
      keyPath(stale.activationId),
      stale.activationId,
      {
        header: line,
      },
    );
    expect([refused.status, refused.body.error.code, refused.body.error.details.reason]).toEqual([
      410,
      "ACTIVATION_DEACTIVATED",
      "culled",
    ]);
    expect(refused.body.response_assertion?.status).toBe(410);
    expect(refused.body.data).toBeUndefined();
    const row = t.deps.sqlite
      .query<{ status: string; deactivation_reason: string }, [string]>(
        "SELECT status, deactivation_reason FROM activations WHERE id = ?",
      )
      .get(stale.activationId);
    expect(row).toEqual({ status: "deactivated", deactivation_reason: "culled" });
    const granted = await proofCall(
      t,
      fresh.device,
      "POST",
      keyPath(fresh.activationId),
      fresh.activationId,
      {
        header: line,
      },
    );
    expect(granted.status).toBe(200);
    expect(granted.body.data.activation_id).toBe(fresh.activationId);
  });

  test("refused key requests are not recorded in runtime_events, unlike a refused heartbeat", async () => {
    const line = headerLine(await sealed(pattern(10), { entitlement: "missing" }));
    const { device, activationId } = await activatedDevice(t, fx);
    const before = runtimeEventCount();
    expect(
      (await proofCall(t, device, "POST", keyPath(activationId), activationId, { header: line })).status,
    ).toBe(403);
    expect(
      (await proofCall(t, device, "POST", keyPath(activationId), activationId, { header: "{}" })).status,
    ).toBe(422);
    expect(
      (await proofCall(t, new TestDevice(), "POST", keyPath(activationId), activationId, { header: line }))
        .status,
    ).toBe(401);
    expect(runtimeEventCount()).toBe(before);
    const beat = `/runtime/v1/activations/${activationId}/heartbeat`;
    expect((await proofCall(t, new TestDevice(), "POST", beat, activationId, {})).status).toBe(401);
    expect(runtimeEventCount()).toBe((before ?? 0) + 1);
  });
});
