import { describe, expect, test } from "bun:test";
import { createPublicKey } from "node:crypto";
import { Value } from "@sinclair/typebox/value";
import { compactVerify, importJWK } from "jose";
import { b64u, sha256Hex } from "../../src/crypto/encoding.ts";
import { hpkeOpen, hpkeSeal } from "../../src/crypto/hpke.ts";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { keyIdOf, publicKeyText, signEd25519, thumbprint } from "../../src/crypto/keys.ts";
import { buildOfflinePackage } from "../../src/crypto/offline-package.ts";
import {
  chunkNonce,
  encryptChunk,
  headerSha256,
  newSealedHeader,
  parseSealedHeader,
  payloadKey,
  SEALED_INFO,
  type SealedHeader,
  sealedCore,
  sealingKeyLine,
} from "../../src/crypto/sealed-file.ts";
import { FieldErrorCollector } from "../../src/http/errors.ts";
import { type CertificateSubject, issueCertificate } from "../../src/modules/activations/certificate.ts";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { OfflineRequest, type OfflineRequestBody } from "../../src/modules/offline/model.ts";
import { offlineRequestMessage, verifyOfflineRequest } from "../../src/modules/offline/request.ts";
import { hpkeOpen as sdkHpkeOpen } from "../../src/sdk/hpke.ts";
import { resolveConfig, verifyOfflinePackage } from "../../src/sdk/index.ts";
import { ByteReader, decryptSealedPayload, readSealedHeader } from "../../src/sdk/sealed.ts";
import { vector as protocolVector, type VectorName } from "../support/protocol-vectors.ts";
import { ed25519FromHex, p256FromHex } from "../support/vectors.ts";

/**
 * The offline request, offline package and sealed-file vectors of docs/protocol.md (§17-§19),
 * recomputed with the server's code and accepted by the SDK's.
 */
// biome-ignore lint/suspicious/noExplicitAny: vectors are JSON read from the document.
const vector = (name: VectorName): any => protocolVector(name);
const hex = (text: string) => new Uint8Array(Buffer.from(text, "hex"));
const publicOf = (seedHex: string) => publicKeyText(createPublicKey(ed25519FromHex(seedHex)));

describe("offline request", () => {
  const v = vector("offline-request");

  test("the proof is the device key's signature over the documented string", () => {
    const { device_proof, ...signed } = v.request as OfflineRequestBody;
    expect(offlineRequestMessage(signed)).toBe(v.signing_string);
    expect(signEd25519(ed25519FromHex(v.device_seed_hex), v.signing_string)).toBe(device_proof);
    expect(v.request.device_signing_public_key).toBe(publicOf(v.device_seed_hex));
    expect(v.request.device_kem_public_key).toBe(`p256:${b64u.encode(p256FromHex(v.kem_scalar_hex).point)}`);
  });

  test("the server's schema and checks accept it, with the documented identity hash and digest", () => {
    expect(Value.Check(OfflineRequest, v.request)).toBe(true);
    const errors = new FieldErrorCollector();
    const verified = verifyOfflineRequest(v.request, v.request.product_id, errors);
    expect(errors.empty).toBe(true);
    expect(verified?.identity).toBe(v.request_sha256);
    // The identity is the hash of the string the proof signs, so the proof's spelling is not in it.
    expect(sha256Hex(v.signing_string)).toBe(v.request_sha256);
    expect(machineInfoDigest(v.request.machine_info)).toBe(v.machine_info_digest);
  });
});

describe("offline package", () => {
  /** The app config of the vector's product, as a vendor would ship it. */
  const vectorConfig = () =>
    resolveConfig({
      service_config_version: 1,
      environment: "live",
      api_url: v.license_jwt_claims.iss,
      product: { id: v.manifest.product_id },
      trust_anchor: { key_id: keyIdOf(v.root_public_key), root_public_key: v.root_public_key },
    });

  const v = vector("offline-package");
  const request = vector("offline-request").request;
  const bundle = vector("trust-bundle").data;
  const signingKey = ed25519FromHex(v.signing_seed_hex);

  test("the server's certificate code makes the documented license.jwt claims, jti aside", () => {
    const from = v.issued_from;
    const subject = {
      license: {
        id: from.license.id,
        productId: from.license.product_id,
        status: from.license.status,
        licenseType: from.license.license_type,
        expiresAt: from.license.expires_at,
        entitlements: from.license.entitlements,
        maxConcurrentOverride: from.license.max_concurrent_override,
      },
      policy: from.policy,
      activationId: from.activation_id,
      deviceThumbprint: thumbprint(request.device_signing_public_key),
      machineInfoDigest: machineInfoDigest(request.machine_info),
    } as unknown as CertificateSubject;
    const trust = {
      signingKey: () => ({
        keyId: keyIdOf(publicOf(v.signing_seed_hex)),
        privateKey: signingKey,
        notBefore: 0,
      }),
    };
    const { certificate } = issueCertificate(trust, from.issuer, subject, new Date(from.now * 1000), {
      offlineUntil: from.expires_at,
    });
    const claims = JSON.parse(Buffer.from(certificate.split(".")[1] ?? "", "base64url").toString());
    expect({ ...claims, jti: v.license_jwt_claims.jti }).toEqual(v.license_jwt_claims);
    expect(Object.keys(claims)).toEqual(Object.keys(v.license_jwt_claims));
  });

  test("the manifest, its signature and the whole archive are exactly what the server builds", () => {
    const built = buildOfflinePackage(
      {
        manifest: {
          product_id: v.manifest.product_id,
          license_id: v.manifest.license_id,
          assignment_id: null,
          device_signing_key_thumbprint: thumbprint(request.device_signing_public_key),
          device_kem_key_thumbprint: thumbprint(request.device_kem_public_key),
          issued_at: v.issued_from.now,
          expires_at: v.issued_from.expires_at,
        },
        licenseJwt: v.license_jwt,
        trustBundle: bundle,
      },
      signingKey,
    );
    expect(built.manifest).toEqual(v.manifest);
    expect(canonicalize(built.manifest)).toBe(v.manifest_json);
    expect(`Service-Offline-Package-v1\n${v.manifest_json}`).toBe(v.signing_string);
    expect(built.signature).toBe(v.manifest_sig);
    expect(sha256Hex(built.bytes)).toBe(v.package_sha256);
    expect(b64u.encode(built.bytes)).toBe(v.package_b64u);
  });

  test("jose verifies license.jwt with the bundle's key; the SDK accepts the archive for the documented device", async () => {
    const key = bundle.bundle.signing_keys.find((k: { status: string }) => k.status === "active");
    const jwk = await importJWK(
      { kty: "OKP", crv: "Ed25519", x: key.public_key.slice("ed25519:".length) },
      "EdDSA",
    );
    const { payload } = await compactVerify(v.license_jwt, jwk);
    expect(JSON.parse(new TextDecoder().decode(payload))).toEqual(v.license_jwt_claims);
    const config = vectorConfig();
    const verified = verifyOfflinePackage(b64u.decode(v.package_b64u), {
      config,
      device: {
        signingPublicKey: request.device_signing_public_key,
        kemPublicKey: request.device_kem_public_key,
      },
    });
    expect(verified.manifest).toEqual(v.manifest);
    expect(verified.certificate.jws).toBe(v.license_jwt);
  });

  test("the SDK refuses a correctly signed manifest with a member the format does not have, or without one it has", () => {
    const config = vectorConfig();
    const { format: _format, files: _files, ...fields } = v.manifest;
    const signedWith = (manifest: Record<string, unknown>) =>
      buildOfflinePackage(
        { manifest: manifest as never, licenseJwt: v.license_jwt, trustBundle: bundle },
        signingKey,
      ).bytes;
    const device = {
      signingPublicKey: request.device_signing_public_key,
      kemPublicKey: request.device_kem_public_key,
    };
    expect(() => verifyOfflinePackage(signedWith(fields), { config, device })).not.toThrow();
    const { assignment_id: _assignment, ...withoutOne } = fields;
    for (const manifest of [{ ...fields, extra_member: "not in the format" }, withoutOne]) {
      let code: string | undefined;
      try {
        verifyOfflinePackage(signedWith(manifest), { config, device });
      } catch (error) {
        code = (error as { code?: string }).code;
      }
      expect(code).toBe("PACKAGE_INVALID");
    }
  });
});

describe("sealed file", () => {
  const v = vector("sealed-file");
  const sealing = p256FromHex(v.sealing_scalar_hex);

  test("the sealing key line names the key id of its own point", () => {
    expect(v.public_key).toBe(`p256:${b64u.encode(sealing.point)}`);
    expect(v.key_id).toBe(keyIdOf(v.public_key));
    expect(sealingKeyLine(v.header.product_id, v.key_id, sealing.point)).toBe(v.sealing_key);
  });

  test("the server's sealing code gives the documented header, core, hash, payload key and chunk", async () => {
    const { header, line } = await newSealedHeader(
      { productId: v.header.product_id, keyId: v.key_id, point: sealing.point },
      {
        entitlement: v.entitlement,
        fixed: {
          dek: hex(v.dek_hex),
          payloadSalt: hex(v.payload_salt_hex),
          fileId: v.file_id,
          ephemeralIkm: hex(v.product_ephemeral_ikm_hex),
        },
      },
    );
    expect(header).toEqual(v.header);
    expect(line).toBe(v.header_line);
    expect(parseSealedHeader(line).ok).toBe(true);
    expect(sealedCore(header)).toBe(v.core);
    expect(headerSha256(line)).toBe(v.header_sha256);
    const key = payloadKey(hex(v.dek_hex), hex(v.payload_salt_hex));
    expect(key.toString("hex")).toBe(v.payload_key_hex);
    expect(chunkNonce(0, true).toString("hex")).toBe(v.chunk_nonce_hex);
    for (const [index, last, expected] of v.chunk_nonces)
      expect(chunkNonce(index, last).toString("hex")).toBe(expected);
    expect(encryptChunk(key, 0, true, new TextEncoder().encode(v.plaintext)).toString("hex")).toBe(
      v.payload_hex,
    );
    const file = Buffer.concat([Buffer.from(`SVCSEAL1\n${line}\n`), Buffer.from(v.payload_hex, "hex")]);
    expect(b64u.encode(file)).toBe(v.file_b64u);
    const opened = await hpkeOpen(
      hex(v.sealing_scalar_hex),
      b64u.decode(header.enc),
      b64u.decode(header.wrapped_key),
      SEALED_INFO.product,
      v.core,
    );
    expect(Buffer.from(opened).toString("hex")).toBe(v.dek_hex);
  });

  test("the key release answer is the data key sealed to the device's KEM key, and the SDK opens the file with it", async () => {
    const release = v.key_release;
    const device = p256FromHex(release.kem_scalar_hex);
    expect(release.aad).toBe(`${v.core}\n${release.activation_id}`);
    const wrapped = await hpkeSeal(
      device.point,
      hex(v.dek_hex),
      SEALED_INFO.device,
      release.aad,
      hex(release.device_ephemeral_ikm_hex),
    );
    expect(release.data).toEqual({
      activation_id: release.activation_id,
      file_id: v.file_id,
      header_sha256: v.header_sha256,
      enc: b64u.encode(wrapped.enc),
      wrapped_key: b64u.encode(wrapped.ciphertext),
    });
    const reader = new ByteReader(b64u.decode(v.file_b64u));
    const read = await readSealedHeader(reader);
    expect(read.headerSha256).toBe(v.header_sha256);
    const dek = await sdkHpkeOpen(
      hex(release.kem_scalar_hex),
      b64u.decode(release.data.enc),
      b64u.decode(release.data.wrapped_key),
      "Service-Sealed-File-v1 device",
      release.aad,
    );
    const plain = await new Response(decryptSealedPayload(reader, read.header as SealedHeader, dek)).text();
    expect(plain).toBe(v.plaintext);
  });
});
