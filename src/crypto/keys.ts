import { createPrivateKey, createPublicKey, type KeyObject, sign, verify } from "node:crypto";
import { ed25519 } from "@noble/curves/ed25519.js";
import { b64u, sha256Hex } from "./encoding.ts";

/**
 * Key strings of the contract (DESIGN §5): `ed25519:<b64u 32 bytes>` and
 * `p256:<b64u 65-byte uncompressed point>`. Thumbprint = hex SHA-256 of the string; key id =
 * `k_` + its first 20 hex characters.
 */
export type KeyAlgorithm = "ed25519" | "p256";

export interface PublicKeyInfo {
  alg: KeyAlgorithm;
  text: string;
  key: KeyObject;
}

const ED25519_PREFIX = "ed25519:";
const P256_PREFIX = "p256:";

export const thumbprint = (publicKeyText: string): string => sha256Hex(publicKeyText);
export const keyIdOf = (publicKeyText: string): string => `k_${thumbprint(publicKeyText).slice(0, 20)}`;

/**
 * Parses a contract key string; null for anything malformed, not on the curve or of small order.
 * `vetted`: the key was accepted (and its point checked) when it was first stored, so the point
 * is not decoded again in JavaScript on every heartbeat of a cold device.
 */
export function parsePublicKey(text: string, options: { vetted?: boolean } = {}): PublicKeyInfo | null {
  if (typeof text !== "string" || text.length > 200) return null;
  try {
    if (text.startsWith(ED25519_PREFIX)) {
      const raw = b64u.decode(text.slice(ED25519_PREFIX.length));
      if (raw.length !== 32 || b64u.encode(raw) !== text.slice(ED25519_PREFIX.length)) return null;
      if (!options.vetted && !isSafeEd25519Point(raw)) return null;
      const key = createPublicKey({
        key: { kty: "OKP", crv: "Ed25519", x: b64u.encode(raw) },
        format: "jwk",
      });
      return { alg: "ed25519", text, key };
    }
    if (text.startsWith(P256_PREFIX)) {
      const raw = b64u.decode(text.slice(P256_PREFIX.length));
      if (raw.length !== 65 || raw[0] !== 4 || b64u.encode(raw) !== text.slice(P256_PREFIX.length))
        return null;
      const key = createPublicKey({
        key: {
          kty: "EC",
          crv: "P-256",
          x: b64u.encode(raw.subarray(1, 33)),
          y: b64u.encode(raw.subarray(33)),
        },
        format: "jwk",
      });
      return { alg: "p256", text, key };
    }
  } catch {
    return null;
  }
  return null;
}

/**
 * A device key must not be of small order: a small-order key (the identity, say) "verifies" a
 * forged signature over any message with node:crypto, which would let anyone sign as that device.
 * Decoding also refuses non-canonical encodings and points off the curve.
 *
 * A mixed-order key (a proper point plus a torsion component) is not refused: only its owner can
 * sign for it, and only this server verifies device signatures, so cofactored and cofactorless
 * verifiers cannot disagree about it. The full subgroup check costs ~0.5 ms of JavaScript per
 * key, three times a whole activation's floor (docs/performance.md).
 */
function isSafeEd25519Point(raw: Uint8Array): boolean {
  try {
    const point = ed25519.Point.fromBytes(raw);
    return !point.isSmallOrder();
  } catch {
    return false;
  }
}

/** The contract string of a public key object. */
export function publicKeyText(key: KeyObject): string {
  const jwk = key.export({ format: "jwk" });
  if (jwk.kty === "OKP" && jwk.crv === "Ed25519" && jwk.x) return `${ED25519_PREFIX}${jwk.x}`;
  if (jwk.kty === "EC" && jwk.crv === "P-256" && jwk.x && jwk.y) {
    const point = new Uint8Array(65);
    point[0] = 4;
    point.set(b64u.decode(jwk.x), 1);
    point.set(b64u.decode(jwk.y), 33);
    return `${P256_PREFIX}${b64u.encode(point)}`;
  }
  throw new Error(`unsupported key type ${jwk.kty}/${jwk.crv}`);
}

/** An Ed25519 private key from its 32-byte seed. */
export function ed25519FromSeed(seed: Uint8Array): KeyObject {
  if (seed.length !== 32) throw new Error("an Ed25519 seed is 32 bytes");
  // PKCS#8 prefix for a bare Ed25519 seed (RFC 8410).
  const prefix = Buffer.from("302e020100300506032b657004220420", "hex");
  return createPrivateKey({ key: Buffer.concat([prefix, seed]), format: "der", type: "pkcs8" });
}

export const privateKeyFromPkcs8 = (der: Uint8Array): KeyObject =>
  createPrivateKey({ key: Buffer.from(der), format: "der", type: "pkcs8" });

/**
 * Signatures made and checked by this process, for GET /metrics. Every server signature and
 * every device-signature check passes through the two functions below, so counting here misses
 * none; an increment costs nothing next to the signature itself.
 */
export const cryptoCounters = { signatures: 0, verifications: 0 };

/** Ed25519 signature over `message`, as b64u of the raw 64 bytes. */
export const signEd25519 = (key: KeyObject, message: string | Uint8Array): string => {
  cryptoCounters.signatures++;
  return b64u.encode(sign(null, typeof message === "string" ? Buffer.from(message) : message, key));
};

const SIGNATURE_PATTERN = /^[A-Za-z0-9_-]{86}$/;

/**
 * Verifies a device or key signature: Ed25519, or P-256 ECDSA over SHA-256 as raw r||s.
 * Malformed signatures are simply invalid, never an exception.
 */
export function verifySignature(
  info: PublicKeyInfo,
  message: string | Uint8Array,
  signature: string,
): boolean {
  cryptoCounters.verifications++;
  if (typeof signature !== "string" || !SIGNATURE_PATTERN.test(signature)) return false;
  const raw = b64u.decode(signature);
  if (raw.length !== 64) return false;
  const data = typeof message === "string" ? Buffer.from(message) : message;
  try {
    return info.alg === "ed25519"
      ? verify(null, data, info.key, raw)
      : verify("sha256", data, { key: info.key, dsaEncoding: "ieee-p1363" }, raw);
  } catch {
    return false;
  }
}
