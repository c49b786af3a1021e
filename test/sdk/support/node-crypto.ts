/**
 * An independent verifier built on node:crypto (Bun's BoringSSL), so tests do not check the SDK's
 * signatures with the same library that made them. Test code only; the SDK never imports node:*.
 */
import { createHash, createPublicKey, type KeyObject, verify } from "node:crypto";

function nodeKey(publicKey: string): { key: KeyObject; alg: "ed25519" | "p256" } {
  const [prefix, body] = publicKey.split(":") as [string, string];
  const bytes = Buffer.from(body, "base64url");
  if (prefix === "ed25519") {
    return {
      key: createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: body }, format: "jwk" }),
      alg: "ed25519",
    };
  }
  if (prefix !== "p256" || bytes.length !== 65 || bytes[0] !== 4) throw new Error("bad key");
  const x = bytes.subarray(1, 33).toString("base64url");
  const y = bytes.subarray(33, 65).toString("base64url");
  return { key: createPublicKey({ key: { kty: "EC", crv: "P-256", x, y }, format: "jwk" }), alg: "p256" };
}

/** Verifies a b64u raw signature (Ed25519, or P-256 r||s over SHA-256) with node:crypto. */
export function nodeVerify(publicKey: string, message: string | Uint8Array, signature: string): boolean {
  const { key, alg } = nodeKey(publicKey);
  const sig = Buffer.from(signature, "base64url");
  const msg = typeof message === "string" ? Buffer.from(message, "utf8") : Buffer.from(message);
  if (alg === "ed25519") return verify(null, msg, key, sig);
  return verify("sha256", msg, { key, dsaEncoding: "ieee-p1363" }, sig);
}

export function nodeSha256Hex(input: string | Uint8Array): string {
  return createHash("sha256").update(input).digest("hex");
}
