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
/** What `keyIdOf` makes: `k_` + 20 lowercase hex characters (a key id given by a user or a file). */
export const KEY_ID = /^k_[0-9a-f]{20}$/;

/**
 * Parses a contract key string; null for anything malformed, not on the curve or of small order.
 * `vetted`: the key was accepted (and its point checked) when it was first stored, so the point
 * is not decoded again in JavaScript on every heartbeat of a cold device.
 * `signatureFollows`: the caller verifies a signature by this key before it stores or trusts
 * anything about it (a device proof), so an Ed25519 point off the curve is left for that verify
 * to refuse instead of being decoded here (see isAcceptableEd25519Encoding).
 */
export function parsePublicKey(
  text: string,
  options: { vetted?: boolean; signatureFollows?: boolean } = {},
): PublicKeyInfo | null {
  if (typeof text !== "string" || text.length > 200) return null;
  try {
    if (text.startsWith(ED25519_PREFIX)) {
      const raw = b64u.decodeCanonical(text.slice(ED25519_PREFIX.length));
      if (raw?.length !== 32) return null;
      if (!options.vetted) {
        if (!isAcceptableEd25519Encoding(raw)) return null;
        if (!options.signatureFollows && !isOnEd25519Curve(raw)) return null;
      }
      const key = createPublicKey({
        key: { kty: "OKP", crv: "Ed25519", x: b64u.encode(raw) },
        format: "jwk",
      });
      return { alg: "ed25519", text, key };
    }
    if (text.startsWith(P256_PREFIX)) {
      const raw = b64u.decodeCanonical(text.slice(P256_PREFIX.length));
      if (raw?.length !== 65 || raw[0] !== 4) return null;
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
 * Nor may it be a non-canonical encoding (y >= p): node:crypto reduces y, so two strings, and two
 * thumbprints, would name one key.
 *
 * Both are byte checks of constant cost, no point arithmetic: y is canonical when its 255 low bits
 * (little-endian) are below p = 2^255 - 19; the small-order points are the eight torsion points,
 * whose encodings with the sign bit masked are the five in SMALL_ORDER_Y (x = 0 only for y = ±1,
 * so x = 0 with the sign bit set, non-canonical, is refused by that list too). What bytes cannot
 * tell is whether y is on the curve at all; that needs a square root mod p (~60 µs of BigInt
 * arithmetic, a tenth of an activation's CPU). A point off the curve can never verify a signature
 * (node:crypto's verify decodes the key and fails), so callers that verify a device proof right
 * after parsing skip it (`signatureFollows`) and decode only to explain a failed proof
 * (isOnEd25519Curve); every other caller pays for the decode.
 *
 * A mixed-order key (a proper point plus a torsion component) is not refused: only its owner can
 * sign for it, and only this server verifies device signatures, so cofactored and cofactorless
 * verifiers cannot disagree about it. The full subgroup check costs ~0.5 ms of JavaScript per
 * key, three times a whole activation's floor (docs/performance.md).
 */
function isAcceptableEd25519Encoding(raw: Uint8Array): boolean {
  const top = (raw[31] as number) & 0x7f;
  // p = 0x7fff…ffed: y >= p only when every byte above the lowest is at its maximum.
  if (top === 0x7f && (raw[0] as number) >= 0xed) {
    let i = 1;
    while (i < 31 && raw[i] === 0xff) i++;
    if (i === 31) return false;
  }
  for (const small of SMALL_ORDER_Y) {
    if (top !== small[31]) continue;
    let i = 0;
    while (i < 31 && raw[i] === small[i]) i++;
    if (i === 31) return false;
  }
  return true;
}

/**
 * The encodings (sign bit masked) of the eight points of order dividing 8: y = 1 (the identity),
 * y = p - 1 (order 2), y = 0 (the two of order 4), and y8, p - y8 (the four of order 8).
 * test/unit/keys.test.ts recomputes this list from the curve.
 */
const SMALL_ORDER_Y: readonly Uint8Array[] = [
  "0000000000000000000000000000000000000000000000000000000000000000",
  "0100000000000000000000000000000000000000000000000000000000000000",
  "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
  "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
  "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
].map((hex) => Uint8Array.from(Buffer.from(hex, "hex")));

/** Exported for the tests that recompute it. */
export const ED25519_SMALL_ORDER_Y = SMALL_ORDER_Y;

/** Whether an Ed25519 key's point is on the curve: the full decode, ~60 µs. P-256 keys: always. */
export function isOnCurve(info: PublicKeyInfo): boolean {
  return info.alg !== "ed25519" || isOnEd25519Curve(b64u.decode(info.text.slice(ED25519_PREFIX.length)));
}

function isOnEd25519Curve(raw: Uint8Array): boolean {
  try {
    ed25519.Point.fromBytes(raw);
    return true;
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
  return sign(null, typeof message === "string" ? Buffer.from(message) : message, key).toString("base64url");
};

const SIGNATURE_PATTERN = /^[A-Za-z0-9_-]{86}$/;

/**
 * Verifies a device or key signature: Ed25519, or P-256 ECDSA over SHA-256 as raw r||s.
 * Malformed signatures are simply invalid, never an exception, and so is a non-canonical spelling
 * (86 characters carry 516 bits for 512: the last character's 4 spare bits must be zero), so one
 * signature has one text.
 */
export function verifySignature(
  info: PublicKeyInfo,
  message: string | Uint8Array,
  signature: string,
): boolean {
  cryptoCounters.verifications++;
  if (typeof signature !== "string" || !SIGNATURE_PATTERN.test(signature)) return false;
  const raw = b64u.decodeCanonical(signature);
  if (raw?.length !== 64) return false;
  const data = typeof message === "string" ? Buffer.from(message) : message;
  try {
    return info.alg === "ed25519"
      ? verify(null, data, info.key, raw)
      : verify("sha256", data, { key: info.key, dsaEncoding: "ieee-p1363" }, raw);
  } catch {
    return false;
  }
}
