import { describe, expect, test } from "bun:test";
import { createPublicKey } from "node:crypto";
import { Value } from "@sinclair/typebox/value";
import { sha256Hex } from "../../src/crypto/encoding.ts";
import { PREFIX } from "../../src/crypto/envelope.ts";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { parsePublicKey, publicKeyText, signEd25519, verifySignature } from "../../src/crypto/keys.ts";
import { TrialConfirm, type TrialConfirmBody } from "../../src/modules/trials/model.ts";
import { trialIdempotentPartOf } from "../../src/modules/trials/service.ts";
import { vector as protocolVector } from "../support/protocol-vectors.ts";
import { ed25519FromHex } from "../support/vectors.ts";

/** The trial-confirm vector of docs/protocol.md, recomputed with the server's code. */
interface TrialVector {
  device_seed_hex: string;
  verification_id: string;
  idempotency_key: string;
  body: TrialConfirmBody;
  signing_string: string;
  idempotency_part: Record<string, unknown>;
  idempotency_fingerprint: string;
}

const vector = protocolVector<TrialVector>("trial-confirm");

describe("trial-confirm", () => {
  test("the proof is the device key's signature over the trial prefix and JCS of the body without it", () => {
    const device = ed25519FromHex(vector.device_seed_hex);
    expect(vector.body.device_signing_public_key).toBe(publicKeyText(createPublicKey(device)));
    const { device_proof, ...signedPart } = vector.body;
    expect(PREFIX.trialProof).toBe("Service-Trial-Proof-v1\n");
    expect(PREFIX.trialProof + canonicalize(signedPart)).toBe(vector.signing_string);
    expect(signEd25519(device, vector.signing_string)).toBe(device_proof);
    const key = parsePublicKey(vector.body.device_signing_public_key);
    if (!key) throw new Error("the vector's device key does not parse");
    expect(verifySignature(key, vector.signing_string, device_proof)).toBe(true);
  });

  test("the same proof does not verify as an activation proof, nor an activation proof as a trial one", () => {
    const device = ed25519FromHex(vector.device_seed_hex);
    const key = parsePublicKey(vector.body.device_signing_public_key);
    if (!key) throw new Error("the vector's device key does not parse");
    const { device_proof, ...signedPart } = vector.body;
    const asActivation = PREFIX.activationProof + canonicalize(signedPart);
    expect(verifySignature(key, asActivation, device_proof)).toBe(false);
    expect(verifySignature(key, vector.signing_string, signEd25519(device, asActivation))).toBe(false);
  });

  test("the body passes the server's schema and idempotency compares the documented part", () => {
    expect(Value.Check(TrialConfirm, vector.body)).toBe(true);
    expect(vector.idempotency_key).toMatch(/^[\x21-\x7E]{16,255}$/);
    const part = { verification_id: vector.verification_id, ...trialIdempotentPartOf(vector.body) };
    expect(part).toEqual(vector.idempotency_part as typeof part);
    expect(sha256Hex(canonicalize(part))).toBe(vector.idempotency_fingerprint);
    const retry = {
      ...vector.body,
      nonce: "another-nonce-for-a-retry",
      client_time: vector.body.client_time + 30,
    };
    expect(
      sha256Hex(canonicalize({ verification_id: vector.verification_id, ...trialIdempotentPartOf(retry) })),
    ).toBe(vector.idempotency_fingerprint);
  });
});
