/**
 * Public key strings, thumbprints, key ids, signatures, and the device's own key pairs.
 *
 * - `ed25519:<b64u 32 bytes>` and `p256:<b64u 65-byte uncompressed SEC1 point>`.
 * - thumbprint = lowercase hex SHA-256 of the UTF-8 key string; key id = "k_" + its first 20 hex.
 * - signatures: b64u of raw Ed25519 (64 bytes) or P-256 r||s (64 bytes, ECDSA over SHA-256).
 *   P-256 signatures are produced low-S; verification accepts low-S and high-S.
 */
import { ed25519 } from "@noble/curves/ed25519.js";
import { p256 } from "@noble/curves/nist.js";
import { b64uDecode, b64uDecodeLength, b64uEncode, bytesEqual, sha256Hex, utf8 } from "./encoding.ts";
import { SdkError } from "./errors.ts";

export type KeyAlgorithm = "ed25519" | "p256";

export interface ParsedPublicKey {
  alg: KeyAlgorithm;
  bytes: Uint8Array;
}

/** Parses and validates a prefixed public key string. Throws an Error when it is not one. */
export function parsePublicKey(text: string): ParsedPublicKey {
  if (typeof text !== "string") throw new Error("public key must be a string");
  const colon = text.indexOf(":");
  const prefix = text.slice(0, colon);
  const body = text.slice(colon + 1);
  if (prefix === "ed25519") {
    const bytes = b64uDecodeLength(body, 32);
    if (!ed25519.utils.isValidPublicKey(bytes, false)) throw new Error("invalid Ed25519 point");
    return { alg: "ed25519", bytes };
  }
  if (prefix === "p256") {
    const bytes = b64uDecodeLength(body, 65);
    if (bytes[0] !== 0x04 || !p256.utils.isValidPublicKey(bytes, false)) {
      throw new Error("invalid P-256 uncompressed point");
    }
    return { alg: "p256", bytes };
  }
  throw new Error("unknown public key prefix");
}

export function formatPublicKey(alg: KeyAlgorithm, bytes: Uint8Array): string {
  return `${alg}:${b64uEncode(bytes)}`;
}

/** Lowercase hex SHA-256 of the key string (UTF-8). Used as `cnf.jkt` and for key ids. */
export function thumbprint(publicKey: string): string {
  return sha256Hex(utf8(publicKey));
}

/** "k_" + the first 20 hex characters of the thumbprint. */
export function keyIdOf(publicKey: string): string {
  return `k_${thumbprint(publicKey).slice(0, 20)}`;
}

/**
 * Verifies a b64u signature over `message` with a prefixed public key string. Returns false for
 * any malformed input (bad key, bad encoding, wrong length) instead of throwing.
 */
export function verifySignature(publicKey: string, message: Uint8Array, signature: unknown): boolean {
  if (typeof signature !== "string") return false;
  try {
    const key = parsePublicKey(publicKey);
    const sig = b64uDecode(signature);
    if (sig.length !== 64) return false;
    if (key.alg === "ed25519") return ed25519.verify(sig, message, key.bytes, { zip215: false });
    return p256.verify(sig, message, key.bytes, { prehash: true, lowS: false, format: "compact" });
  } catch {
    return false;
  }
}

export interface KeyPair {
  alg: KeyAlgorithm;
  secretKey: Uint8Array;
  /** The prefixed public key string. */
  publicKey: string;
}

/** The device's keys: a signing key (ed25519 or p256) and a separate P-256 KEM key. */
export interface DeviceKeys {
  signing: KeyPair;
  kem: KeyPair;
}

function publicKeyFromSecret(alg: KeyAlgorithm, secretKey: Uint8Array): string {
  const bytes = alg === "ed25519" ? ed25519.getPublicKey(secretKey) : p256.getPublicKey(secretKey, false);
  return formatPublicKey(alg, bytes);
}

export function generateKeyPair(alg: KeyAlgorithm): KeyPair {
  const secretKey = alg === "ed25519" ? ed25519.utils.randomSecretKey() : p256.utils.randomSecretKey();
  return { alg, secretKey, publicKey: publicKeyFromSecret(alg, secretKey) };
}

/** Builds a key pair from a 32-byte secret key (seed for Ed25519, scalar for P-256). */
export function keyPairFromSecret(alg: KeyAlgorithm, secretKey: Uint8Array): KeyPair {
  if (secretKey.length !== 32) throw new Error("secret key must be 32 bytes");
  if (alg === "p256" && !p256.utils.isValidSecretKey(secretKey)) throw new Error("invalid P-256 secret key");
  return { alg, secretKey: secretKey.slice(), publicKey: publicKeyFromSecret(alg, secretKey) };
}

export function generateDeviceKeys(signingAlg: KeyAlgorithm = "ed25519"): DeviceKeys {
  return { signing: generateKeyPair(signingAlg), kem: generateKeyPair("p256") };
}

/** Signs `message`; returns b64u of the raw 64-byte signature (P-256: low-S r||s over SHA-256). */
export function sign(pair: KeyPair, message: Uint8Array): string {
  if (pair.alg === "ed25519") return b64uEncode(ed25519.sign(message, pair.secretKey));
  return b64uEncode(p256.sign(message, pair.secretKey, { prehash: true, lowS: true, format: "compact" }));
}

/** The persisted form of device keys (JSON; private keys are b64u). */
export interface ExportedDeviceKeys {
  v: 1;
  signing: { alg: KeyAlgorithm; private_key: string; public_key: string };
  kem: { alg: "p256"; private_key: string; public_key: string };
}

export function exportDeviceKeys(keys: DeviceKeys): string {
  const out: ExportedDeviceKeys = {
    v: 1,
    signing: {
      alg: keys.signing.alg,
      private_key: b64uEncode(keys.signing.secretKey),
      public_key: keys.signing.publicKey,
    },
    kem: { alg: "p256", private_key: b64uEncode(keys.kem.secretKey), public_key: keys.kem.publicKey },
  };
  return JSON.stringify(out);
}

function importPair(value: unknown, allowed: readonly KeyAlgorithm[]): KeyPair {
  if (typeof value !== "object" || value === null) throw new Error("key entry missing");
  const v = value as Record<string, unknown>;
  const alg = v.alg;
  if (typeof alg !== "string" || !(allowed as readonly string[]).includes(alg)) throw new Error("bad alg");
  if (typeof v.private_key !== "string" || typeof v.public_key !== "string") throw new Error("bad key entry");
  const pair = keyPairFromSecret(alg as KeyAlgorithm, b64uDecodeLength(v.private_key, 32));
  if (pair.publicKey !== v.public_key) throw new Error("public key does not match private key");
  return pair;
}

/** Reads keys written by exportDeviceKeys; checks each public key against its private key. */
export function importDeviceKeys(json: string): DeviceKeys {
  try {
    const parsed: unknown = JSON.parse(json);
    if (typeof parsed !== "object" || parsed === null || (parsed as { v?: unknown }).v !== 1) {
      throw new Error("unsupported device key format");
    }
    const p = parsed as Record<string, unknown>;
    return { signing: importPair(p.signing, ["ed25519", "p256"]), kem: importPair(p.kem, ["p256"]) };
  } catch (cause) {
    throw new SdkError("STORAGE_CORRUPT", "device keys could not be imported", {
      kind: "storage",
      details: { reason: cause instanceof Error ? cause.message : String(cause) },
      cause,
    });
  }
}

export function sameKeyPair(a: KeyPair, b: KeyPair): boolean {
  return a.alg === b.alg && a.publicKey === b.publicKey && bytesEqual(a.secretKey, b.secretKey);
}
