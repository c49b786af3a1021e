import { describe, expect, test } from "bun:test";
import { Value } from "@sinclair/typebox/value";
import { compactVerify, importJWK, jwtVerify } from "jose";
import { b64u, sha256Hex } from "../../src/crypto/encoding.ts";
import { PREFIX } from "../../src/crypto/envelope.ts";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { signCompactJws } from "../../src/crypto/jws.ts";
import { keyIdOf, parsePublicKey, signEd25519, thumbprint, verifySignature } from "../../src/crypto/keys.ts";
import {
  CLOCK_SKEW_SEC,
  DeviceProofVerifier,
  deviceProofMessage,
  readDeviceProofHeaders,
} from "../../src/http/device-proof.ts";
import { ApiError } from "../../src/http/errors.ts";
import {
  CERTIFICATE_NBF_LEEWAY_SEC,
  type CertificateSubject,
  issueCertificate,
} from "../../src/modules/activations/certificate.ts";
import { machineInfoCheck, machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { ActivationCreate, Heartbeat, idempotentPartOf } from "../../src/modules/activations/model.ts";
import type { TrustService } from "../../src/modules/trust/service.ts";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import {
  type ActivationVector,
  type CertificateRulesVector,
  type CertificateVector,
  type DeviceProofVector,
  type IssuedFrom,
  type MachineInfoRulesVector,
  parsed,
  publicOf,
  type TrustBundleVector,
  utf8,
  vector,
} from "../support/protocol-vectors.ts";
import { ed25519FromHex, p256FromHex } from "../support/vectors.ts";

/**
 * The activation, device proof, license certificate and heartbeat machine_info vectors of
 * docs/protocol.md (§8-10, §12), recomputed with the server's code; jose accepts the certificate.
 */
const decodeSegment = (segment: string): unknown =>
  JSON.parse(Buffer.from(segment, "base64url").toString("utf8"));

function subjectFrom(from: IssuedFrom): CertificateSubject {
  const license = {
    id: from.license.id,
    productId: from.license.product_id,
    status: from.license.status,
    licenseType: from.license.license_type,
    expiresAt: from.license.expires_at === null ? null : new Date(from.license.expires_at * 1000),
    entitlements: from.license.entitlements,
    maxConcurrentOverride: from.license.max_concurrent_override,
  } as unknown as CertificateSubject["license"];
  return {
    license,
    policy: from.policy as unknown as CertificateSubject["policy"],
    activationId: from.activation_id,
    deviceThumbprint: thumbprint(from.device_signing_public_key),
    machineInfoDigest: from.machine_info_digest,
  };
}

/** The server's own certificate code, with the documented key standing in for the keystore. */
function serverCertificate(from: IssuedFrom, signingSeedHex: string): Record<string, unknown> {
  const privateKey = ed25519FromHex(signingSeedHex);
  const trust = { signingKey: () => ({ keyId: keyIdOf(publicOf(privateKey)), privateKey }) };
  const { certificate } = issueCertificate(
    trust as unknown as TrustService,
    from.issuer,
    subjectFrom(from),
    new Date(from.now * 1000),
  );
  const [header, payload, signature] = certificate.split(".") as [string, string, string];
  expect(
    verifySignature(parsed(publicOf(privateKey)), `${header}.${payload}`, signature),
    "the server's certificate verifies with its signing key",
  ).toBe(true);
  return decodeSegment(payload) as Record<string, unknown>;
}

function thrownBy(run: () => unknown): ApiError {
  try {
    run();
  } catch (error) {
    if (error instanceof ApiError) return error;
    throw error;
  }
  throw new Error("expected an ApiError");
}

describe("activation", () => {
  test("the activation proof is the one the device key makes over the documented string", () => {
    const v = vector<ActivationVector>("activation");
    const device = ed25519FromHex(v.device_seed_hex);
    expect(v.body.device_signing_public_key).toBe(publicOf(device));
    const { device_proof, ...signedPart } = v.body;
    expect(PREFIX.activationProof + canonicalize(signedPart)).toBe(v.signing_string);
    expect(signEd25519(device, v.signing_string)).toBe(device_proof);
    expect(verifySignature(parsed(v.body.device_signing_public_key), v.signing_string, device_proof)).toBe(
      true,
    );
  });

  test("the activation body passes the server's schema and gives the documented digest", () => {
    const v = vector<ActivationVector>("activation");
    expect(Value.Check(ActivationCreate, v.body)).toBe(true);
    expect(machineInfoDigest(v.body.machine_info)).toBe(v.machine_info_digest);
    expect(v.machine_info_digest).toBe(sha256Hex(canonicalize(v.body.machine_info)));
    expect(parsePublicKey(v.body.device_kem_public_key)?.alg).toBe("p256");
    expect(v.idempotency_key).toMatch(/^[\x21-\x7E]{16,255}$/);
  });

  test("idempotency compares the body without nonce, proof, client time and request id", () => {
    const v = vector<ActivationVector>("activation");
    expect(idempotentPartOf(v.body)).toEqual(v.idempotency_part as ReturnType<typeof idempotentPartOf>);
    expect(sha256Hex(canonicalize(v.idempotency_part))).toBe(v.idempotency_fingerprint);
    const retry = { ...v.body, nonce: "a-fresh-nonce-for-the-retry", client_time: v.body.client_time + 30 };
    retry.request_id = "another-request";
    retry.device_proof = "x".repeat(86);
    expect(sha256Hex(canonicalize(idempotentPartOf(retry)))).toBe(v.idempotency_fingerprint);
  });
});

describe("device proof", () => {
  test("the Ed25519 device proof has the documented signing string and signature", () => {
    const v = vector<DeviceProofVector>("device-proof-ed25519");
    const device = ed25519FromHex(v.device_seed_hex ?? "");
    expect(sha256Hex(utf8(v.body_text))).toBe(v.body_sha256);
    const message = deviceProofMessage({
      method: v.method,
      pathAndQuery: v.path_and_query,
      activationId: v.activation_id,
      timestamp: v.timestamp,
      nonce: v.nonce,
      body: utf8(v.body_text),
    });
    expect(message).toBe(v.signing_string);
    expect(message).toBe(
      [
        "Service-Device-Proof-v1",
        v.method,
        v.path_and_query,
        v.activation_id,
        String(v.timestamp),
        v.nonce,
        v.body_sha256,
      ].join("\n"),
    );
    expect(signEd25519(device, message)).toBe(v.signature);
  });

  test("the documented heartbeat headers and body pass the server's checks once, then count as a replay", () => {
    const v = vector<DeviceProofVector>("device-proof-ed25519");
    const headers = v.headers ?? {};
    expect(headers["X-Service-Signature"]).toBe(v.signature);
    const proof = readDeviceProofHeaders(new Headers(headers));
    expect(proof).toEqual({
      activationId: v.activation_id,
      timestamp: v.timestamp,
      nonce: v.nonce,
      signature: v.signature,
    });
    expect(Value.Check(Heartbeat, JSON.parse(v.body_text))).toBe(true);
    const store = openStore(":memory:");
    try {
      migrate(store.sqlite);
      const verifier = new DeviceProofVerifier(store.sqlite);
      const key = parsed(publicOf(ed25519FromHex(v.device_seed_hex ?? "")));
      const request = { method: v.method, pathAndQuery: v.path_and_query, body: utf8(v.body_text) };
      verifier.verify(proof, request, key, v.timestamp + CLOCK_SKEW_SEC);
      const replay = thrownBy(() => verifier.verify(proof, request, key, v.timestamp));
      expect([replay.code, replay.details.reason]).toEqual(["DEVICE_PROOF_INVALID", "replayed"]);
      const late = thrownBy(() => verifier.verify(proof, request, key, v.timestamp + CLOCK_SKEW_SEC + 1));
      expect([late.code, late.status, late.details.server_time]).toEqual([
        "CLOCK_SKEW",
        401,
        v.timestamp + CLOCK_SKEW_SEC + 1,
      ]);
      const otherBody = { ...request, body: utf8(`${v.body_text} `) };
      const fresh = { ...proof, nonce: "another-nonce-that-is-fresh" };
      const bad = thrownBy(() => verifier.verify(fresh, otherBody, key, v.timestamp));
      expect([bad.code, bad.details.reason]).toEqual(["DEVICE_PROOF_INVALID", "invalid_signature"]);
    } finally {
      store.close();
    }
  });

  test("the P-256 device proof's documented signature verifies over the documented string", () => {
    const v = vector<DeviceProofVector>("device-proof-p256");
    const { privateKey } = p256FromHex(v.device_scalar_hex ?? "");
    expect(publicOf(privateKey)).toBe(v.public_key ?? "");
    expect(v.body_text).toBe("");
    expect(v.body_sha256).toBe(sha256Hex(new Uint8Array(0)));
    const message = deviceProofMessage({
      method: v.method,
      pathAndQuery: v.path_and_query,
      activationId: v.activation_id,
      timestamp: v.timestamp,
      nonce: v.nonce,
      body: new Uint8Array(0),
    });
    expect(message).toBe(v.signing_string);
    const key = parsed(v.public_key ?? "");
    expect(key.alg).toBe("p256");
    expect(verifySignature(key, message, v.signature)).toBe(true);
    expect(verifySignature(key, `${message}0`, v.signature)).toBe(false);
  });
});

describe("license certificate", () => {
  test("the certificate is exactly what the server's signCompactJws makes from the documented header and claims", () => {
    const v = vector<CertificateVector>("certificate");
    const key = ed25519FromHex(v.signing_seed_hex);
    expect(publicOf(key)).toBe(v.public_key);
    expect(signCompactJws(v.header, v.claims, key)).toBe(v.jws);
    const [header, payload] = v.jws.split(".") as [string, string, string];
    expect(decodeSegment(header)).toEqual(v.header);
    expect(decodeSegment(payload)).toEqual(v.claims);
  });

  test("jose verifies the documented certificate with the Ed25519 public key as a JWK", async () => {
    const v = vector<CertificateVector>("certificate");
    expect(`ed25519:${v.public_jwk.x}`).toBe(v.public_key);
    const key = await importJWK(v.public_jwk, "EdDSA");
    const compact = await compactVerify(v.jws, key);
    expect(compact.protectedHeader).toEqual(v.header);
    const { payload, protectedHeader } = await jwtVerify(v.jws, key, {
      algorithms: ["EdDSA"],
      issuer: v.claims.iss,
      audience: v.claims.aud,
      subject: v.claims.sub,
      typ: "service-license+jwt",
      currentDate: new Date(v.claims.iat * 1000),
    });
    expect(protectedHeader).toEqual(v.header);
    expect(payload).toEqual(v.claims);
  });

  test("jose accepts the certificate from nbf and refuses it before nbf and from exp", async () => {
    const v = vector<CertificateVector>("certificate");
    const key = await importJWK(v.public_jwk, "EdDSA");
    const at = (sec: number) => jwtVerify(v.jws, key, { currentDate: new Date(sec * 1000) });
    await expect(at(v.claims.nbf)).resolves.toBeDefined();
    await expect(at(v.claims.exp - 1)).resolves.toBeDefined();
    await expect(at(v.claims.nbf - 1)).rejects.toThrow();
    await expect(at(v.claims.exp)).rejects.toThrow();
  });

  test("the certificate's key, device binding and times follow the documented rules", () => {
    const v = vector<CertificateVector>("certificate");
    const bundleKey = vector<TrustBundleVector>("trust-bundle").data.bundle.signing_keys.find(
      (k) => k.key_id === v.header.kid,
    );
    expect(bundleKey?.status).toBe("active");
    expect(bundleKey?.public_key).toBe(v.public_key);
    expect(v.header.kid).toBe(keyIdOf(v.public_key));
    const activation = vector<ActivationVector>("activation");
    expect(v.claims.cnf.jkt).toBe(thumbprint(activation.body.device_signing_public_key));
    expect(v.claims.machine_info_digest).toBe(activation.machine_info_digest);
    expect(v.claims.nbf).toBe(v.claims.iat - CERTIFICATE_NBF_LEEWAY_SEC);
    expect(CERTIFICATE_NBF_LEEWAY_SEC).toBe(300);
    expect(v.claims.exp).toBeLessThanOrEqual(v.claims.license.expires_at ?? Number.POSITIVE_INFINITY);
    expect(b64u.decode(v.claims.jti).length).toBe(16);
  });

  test("the server's certificate code issues the documented claims in the documented order", () => {
    const v = vector<CertificateVector>("certificate");
    const claims = serverCertificate(v.issued_from, v.signing_seed_hex);
    expect(claims.jti).toMatch(/^[A-Za-z0-9_-]{22}$/);
    expect({ ...claims, jti: v.claims.jti }).toEqual(v.claims);
    expect(Object.keys(claims)).toEqual(Object.keys(v.claims));
    expect(JSON.stringify({ ...claims, jti: v.claims.jti })).toBe(JSON.stringify(v.claims));
  });

  test("each certificate rule case gives the documented times, license state and grace", () => {
    const base = vector<CertificateVector>("certificate");
    const rules = vector<CertificateRulesVector>("certificate-rules");
    expect(rules.defaults).toBe("certificate.issued_from");
    expect(rules.cases.length).toBeGreaterThan(0);
    for (const c of rules.cases) {
      const from: IssuedFrom = {
        ...base.issued_from,
        now: c.now,
        license: { ...base.issued_from.license, ...c.license },
        policy: { ...base.issued_from.policy, ...c.policy },
      };
      const claims = serverCertificate(from, base.signing_seed_hex) as {
        license: Record<string, unknown>;
      } & Record<string, unknown>;
      const got = {
        iat: claims.iat,
        nbf: claims.nbf,
        exp: claims.exp,
        license: {
          status: claims.license.status,
          type: claims.license.type,
          expires_at: claims.license.expires_at,
        },
        heartbeat: claims.heartbeat,
      };
      expect(got as Record<string, unknown>, c.name).toEqual(c.expect);
    }
  });
});

describe("heartbeat machine_info", () => {
  test("each machine_info case gives the documented digest or MACHINE_INFO_REQUIRED reason", () => {
    const rules = vector<MachineInfoRulesVector>("machine-info-rules");
    expect(rules.cases.length).toBeGreaterThan(0);
    const now = new Date(rules.now * 1000);
    for (const c of rules.cases) {
      expect(Value.Check(Heartbeat, c.body), c.name).toBe(true);
      const baseline = {
        machineInfoDigest: rules.baseline_machine_info_digest,
        machineBaselineAt: new Date((rules.now - c.baseline_age_sec) * 1000),
      };
      let got: MachineInfoRulesVector["cases"][number]["expect"];
      try {
        const result = machineInfoCheck(baseline, c.body, c.profile, now);
        got = { digest: result.digest, new_baseline: result.changes.machineBaselineAt !== undefined };
      } catch (error) {
        if (!(error instanceof ApiError)) throw error;
        got = { error: error.code, reason: String(error.details.reason) };
      }
      expect(got as Record<string, unknown>, c.name).toEqual(c.expect);
    }
  });
});
