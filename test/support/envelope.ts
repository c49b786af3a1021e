import { expect } from "bun:test";
import { createHash, createPublicKey, verify } from "node:crypto";
import { canonicalize } from "../../src/crypto/jcs.ts";

const b64u = (text: string) => Buffer.from(text, "base64url");

function ed25519Key(text: string) {
  if (!text.startsWith("ed25519:")) throw new Error(`not an Ed25519 key: ${text}`);
  return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: text.slice(8) }, format: "jwk" });
}

const verifies = (publicKey: string, message: string, signature: string) =>
  verify(null, Buffer.from(message), ed25519Key(publicKey), b64u(signature));

export interface TrustBundleBody {
  product_id: string;
  sequence: number;
  root_key_id: string;
  signing_keys: { key_id: string; public_key: string; status: string }[];
}

/** Checks a trust bundle against the root public key the integration config names. */
export function expectValidBundle(
  data: { bundle: TrustBundleBody; root_signature: string },
  rootPublicKey: string,
): void {
  expect(
    verifies(rootPublicKey, `Service-Trust-Bundle-v1\n${canonicalize(data.bundle)}`, data.root_signature),
  ).toBe(true);
}

/**
 * The client-side verification of DESIGN §5, done independently with node:crypto: delegation by a
 * bundle key, response signature by the delegated key, and nonce, status, product and body hash.
 */
export function expectSignedEnvelope(
  // biome-ignore lint/suspicious/noExplicitAny: response bodies are arbitrary JSON.
  body: any,
  expected: { status: number; nonce: string; productId: string; bundle: TrustBundleBody },
): void {
  const {
    response_assertion: assertion,
    response_signature: signature,
    signing_delegation: delegation,
  } = body;
  const signed = "error" in body ? body.error : body.data;
  expect(assertion).toMatchObject({
    v: 1,
    status: expected.status,
    nonce: expected.nonce,
    product_id: expected.productId,
  });
  expect(assertion.body_sha256).toBe(createHash("sha256").update(canonicalize(signed)).digest("hex"));
  const parent = expected.bundle.signing_keys.find((k) => k.key_id === delegation.delegation.parent_key_id);
  expect(parent).toBeDefined();
  expect(parent?.status).not.toBe("compromised");
  expect(
    verifies(
      parent?.public_key ?? "",
      `Service-Delegation-v1\n${canonicalize(delegation.delegation)}`,
      delegation.signature,
    ),
  ).toBe(true);
  expect(delegation.delegation).toMatchObject({
    v: 1,
    purpose: "runtime-response",
    product_id: expected.productId,
  });
  expect(delegation.delegation.online_key_id).toBe(assertion.key_id);
  expect(delegation.delegation.expires_at - delegation.delegation.issued_at).toBeLessThanOrEqual(7 * 86_400);
  expect(assertion.server_time).toBeGreaterThanOrEqual(delegation.delegation.issued_at);
  expect(assertion.server_time).toBeLessThanOrEqual(delegation.delegation.expires_at);
  expect(
    verifies(delegation.delegation.public_key, `Service-Response-v1\n${canonicalize(assertion)}`, signature),
  ).toBe(true);
}

/** Decodes a compact JWS and checks its signature against the bundle key named by `kid`. */
// biome-ignore lint/suspicious/noExplicitAny: certificate claims are arbitrary JSON.
export function verifiedCertificate(jws: string, bundle: TrustBundleBody): { header: any; claims: any } {
  const [header, payload, signature] = jws.split(".") as [string, string, string];
  const parsedHeader = JSON.parse(b64u(header).toString());
  const key = bundle.signing_keys.find((k) => k.key_id === parsedHeader.kid);
  expect(key).toBeDefined();
  expect(verifies(key?.public_key ?? "", `${header}.${payload}`, signature)).toBe(true);
  return { header: parsedHeader, claims: JSON.parse(b64u(payload).toString()) };
}
