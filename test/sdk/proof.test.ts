import { describe, expect, test } from "bun:test";
import {
  activationProofMessage,
  deviceProofHeaders,
  deviceProofMessage,
  keyPairFromSecret,
  NONCE_PATTERN,
  newIdempotencyKey,
  newNonce,
  signActivationProof,
} from "../../src/sdk/index.ts";
import { nodeVerify } from "./support/node-crypto.ts";

const SEED = Uint8Array.from({ length: 32 }, (_, i) => i);
const ed = keyPairFromSecret("ed25519", SEED);
const pk = keyPairFromSecret("p256", new Uint8Array(32).fill(0x11));
const kemKey = keyPairFromSecret("p256", new Uint8Array(32).fill(0x22));
const ACT = "act_01JABCDEFGHJKMNPQRSTVWXYZ0";
const NONCE = "AAECAwQFBgcICQoLDA0ODw";
const BODY = `{"app_version":"1.2.3","machine_info_digest":"${"ab".repeat(32)}","sdk_version":"0.1.0"}`;
const utf8 = (s: string) => new TextEncoder().encode(s);

const heartbeatInput = {
  method: "POST",
  pathAndQuery: `/runtime/v1/activations/${ACT}/heartbeat`,
  activationId: ACT,
  timestamp: 1_800_000_000,
  nonce: NONCE,
  body: utf8(BODY),
};

describe("device proof (known answers)", () => {
  test("the signed string for a heartbeat is exactly the documented seven lines", () => {
    expect(deviceProofMessage(heartbeatInput)).toBe(
      "Service-Device-Proof-v1\nPOST\n/runtime/v1/activations/act_01JABCDEFGHJKMNPQRSTVWXYZ0/heartbeat\n" +
        "act_01JABCDEFGHJKMNPQRSTVWXYZ0\n1800000000\nAAECAwQFBgcICQoLDA0ODw\n" +
        "e58eaba02bf291122eb52f3f23ee09db552429faa578a7a5d57f8f263740b3b6",
    );
  });

  test("a request without a body hashes the empty string", () => {
    const input = {
      ...heartbeatInput,
      method: "delete",
      pathAndQuery: `/runtime/v1/activations/${ACT}`,
      body: new Uint8Array(),
    };
    expect(deviceProofMessage(input)).toBe(
      "Service-Device-Proof-v1\nDELETE\n/runtime/v1/activations/act_01JABCDEFGHJKMNPQRSTVWXYZ0\n" +
        "act_01JABCDEFGHJKMNPQRSTVWXYZ0\n1800000000\nAAECAwQFBgcICQoLDA0ODw\n" +
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    );
  });

  test("the Ed25519 header signature equals the one Node computes for the fixed key and inputs", () => {
    const keys = { signing: ed, kem: kemKey };
    const headers = deviceProofHeaders(keys, heartbeatInput);
    expect(headers).toEqual({
      "X-Service-Activation": ACT,
      "X-Service-Timestamp": "1800000000",
      "X-Service-Nonce": NONCE,
      "X-Service-Signature":
        "-KXeDg0YwLo8fQ8erq6_gG6wXDSHN4RVo8Mh1Kcgehlx66JQlS_VTdsDXvECCpQCN6PxX5CqGJeLk-uxRdGbAg",
    });
    const empty = {
      ...heartbeatInput,
      method: "DELETE",
      pathAndQuery: `/runtime/v1/activations/${ACT}`,
      body: new Uint8Array(),
    };
    expect(deviceProofHeaders(keys, empty)["X-Service-Signature"]).toBe(
      "-0lZCrOcy6pNAkJtKj3e-jLyj5x2mN6CkQzPiJPG8ESrT8zH5zeQjejSrxbytvN8t22dugWfKH8c_8xg5Y5ZCQ",
    );
  });

  test("the P-256 header signature verifies with Node over the known string", () => {
    const headers = deviceProofHeaders({ signing: pk, kem: kemKey }, heartbeatInput);
    expect(
      nodeVerify(pk.publicKey, deviceProofMessage(heartbeatInput), headers["X-Service-Signature"]!),
    ).toBe(true);
    const otherPath = deviceProofMessage({ ...heartbeatInput, pathAndQuery: "/runtime/v1/leases" });
    expect(nodeVerify(pk.publicKey, otherPath, headers["X-Service-Signature"]!)).toBe(false);
  });
});

describe("activation proof", () => {
  const body = {
    license_key: "LK-TEST",
    product_id: "prod_1",
    device_signing_public_key: ed.publicKey,
    device_kem_public_key: kemKey.publicKey,
    machine_info: { os: "linux", arch: "x64" },
    machine_signals: {},
    app_version: "1.0.0",
    sdk_version: "0.1.0",
    client_time: 1_800_000_000,
    nonce: NONCE,
  };

  test("the activation proof covers the prefix and the JCS of the body without device_proof", () => {
    const expected =
      'Service-Activation-Proof-v1\n{"app_version":"1.0.0","client_time":1800000000,' +
      `"device_kem_public_key":"${kemKey.publicKey}","device_signing_public_key":"${ed.publicKey}",` +
      '"license_key":"LK-TEST","machine_info":{"arch":"x64","os":"linux"},"machine_signals":{},' +
      '"nonce":"AAECAwQFBgcICQoLDA0ODw","product_id":"prod_1","sdk_version":"0.1.0"}';
    expect(activationProofMessage(body)).toBe(expected);
    for (const signing of [ed, pk]) {
      const proof = signActivationProof({ signing, kem: kemKey }, body);
      expect(nodeVerify(signing.publicKey, expected, proof)).toBe(true);
    }
    expect(() => activationProofMessage({ ...body, device_proof: "x" })).toThrow();
  });
});

describe("nonces and idempotency keys", () => {
  test("nonces are 22 fresh base64url characters matching the contract pattern", () => {
    const seen = new Set<string>();
    for (let i = 0; i < 200; i++) {
      const n = newNonce();
      expect(n).toMatch(/^[A-Za-z0-9_-]{22}$/);
      expect(NONCE_PATTERN.test(n)).toBe(true);
      seen.add(n);
    }
    expect(seen.size).toBe(200);
  });

  test("idempotency keys are 32 random base64url characters", () => {
    const a = newIdempotencyKey();
    expect(a).toMatch(/^[A-Za-z0-9_-]{32}$/);
    expect(newIdempotencyKey()).not.toBe(a);
  });
});
