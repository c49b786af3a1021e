import { afterEach, beforeEach, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { sha256Hex } from "../../src/crypto/encoding.ts";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { MACHINE, requestPackage } from "../support/offline.ts";
import { nowSec, type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * What makes two offline requests the same (docs/protocol.md §17): the content the device signed,
 * whatever proof of it comes along, so a used request cannot pass as new with another proof.
 */
let t: TestContext;
let fx: RuntimeFixture;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { validation_mode: "offline", max_machines: 2 },
    license: { expires_at: new Date(t.clock.now().getTime() + 90 * 86_400_000).toISOString() },
  });
});
afterEach(() => t.close());

type Request = Record<string, unknown> & { device_proof: string };

/** The request's content, and a proof of it: each call signs afresh. */
function signedContent(device: TestDevice) {
  const content = {
    format: "service-offline-request-v1",
    product_id: fx.productId,
    device_signing_public_key: device.signingPublic,
    device_kem_public_key: device.kemPublic,
    machine_info: MACHINE,
    nonce: randomBytes(16).toString("base64url"),
    generated_at: nowSec(t),
  };
  return (): Request => ({
    ...content,
    device_proof: device.sign(`Service-Offline-Request-v1\n${canonicalize(content)}`),
  });
}

const P256_N = BigInt("0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551");

/** The same P-256 signature with s replaced by n - s: it verifies just as well. */
function otherS(request: Request): Request {
  const raw = Buffer.from(request.device_proof, "base64url");
  const s = P256_N - BigInt(`0x${raw.subarray(32).toString("hex")}`);
  const sBytes = Buffer.from(s.toString(16).padStart(64, "0"), "hex");
  return { ...request, device_proof: Buffer.concat([raw.subarray(0, 32), sBytes]).toString("base64url") };
}

const count = (table: "activations" | "offline_packages") =>
  t.deps.sqlite.query<{ n: number }, []>(`SELECT count(*) AS n FROM ${table}`).get()?.n;

test("a used request sent with another valid proof of the same content answers the same package, then 409 OFFLINE_REQUEST_USED once its device is deactivated", async () => {
  const sign = signedContent(new TestDevice("p256"));
  const request = sign();
  const first = await requestPackage(t, fx.licenseId, request);
  expect(first.status).toBe(200);
  const proofs = [sign(), otherS(request)];
  expect(proofs.map((p) => p.device_proof)).not.toContain(request.device_proof);

  for (const again of proofs) {
    const response = await requestPackage(t, fx.licenseId, again);
    expect(response.status).toBe(200);
    expect(response.headers.get("idempotent-replayed")).toBe("true");
    expect(Buffer.from(response.bytes).equals(Buffer.from(first.bytes))).toBe(true);
  }

  const activationId = t.deps.sqlite.query<{ id: string }, []>("SELECT id FROM activations").get()?.id;
  expect((await t.call("DELETE", `/mgmt/v1/activations/${activationId}`)).status).toBe(204);
  for (const again of [request, ...proofs]) {
    const response = await requestPackage(t, fx.licenseId, again);
    expect([response.status, response.error?.code, response.error?.details?.reason]).toEqual([
      409,
      "OFFLINE_REQUEST_USED",
      "device_deactivated",
    ]);
  }
  expect([count("activations"), count("offline_packages")]).toEqual([1, 1]);
});

test("a proof re-spelled in non-canonical base64url is refused on device_proof and issues nothing", async () => {
  const request = signedContent(new TestDevice("ed25519"))();
  const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const last = ALPHABET.indexOf(request.device_proof.at(-1) as string);
  const respelled = { ...request, device_proof: request.device_proof.slice(0, -1) + ALPHABET[last | 1] };
  expect(Buffer.from(respelled.device_proof, "base64url")).toEqual(
    Buffer.from(request.device_proof, "base64url"),
  );

  const response = await requestPackage(t, fx.licenseId, respelled);

  expect([response.status, response.error?.code]).toEqual([422, "VALIDATION_FAILED"]);
  expect(Object.keys(response.error?.details?.errors ?? {})).toEqual(["request.device_proof"]);
  expect([count("activations"), count("offline_packages")]).toEqual([0, 0]);
});

test("a package stored under the former identity (the whole request's hash) is still found for its request", async () => {
  const request = signedContent(new TestDevice("ed25519"))();
  const first = await requestPackage(t, fx.licenseId, request);
  expect(first.status).toBe(200);
  // As a package issued before the identity left the proof out was stored.
  t.deps.sqlite.run("UPDATE offline_packages SET request_sha256 = ?", [sha256Hex(canonicalize(request))]);

  const again = await requestPackage(t, fx.licenseId, request);

  expect(again.status).toBe(200);
  expect(again.headers.get("idempotent-replayed")).toBe("true");
  expect(count("offline_packages")).toBe(1);
});
