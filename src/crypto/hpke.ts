import { createPrivateKey, type KeyObject } from "node:crypto";
import { Aes256Gcm, CipherSuite, DhkemP256HkdfSha256, HkdfSha256 } from "@hpke/core";

/**
 * HPKE (RFC 9180) in the one suite the contract uses: DHKEM(P-256, HKDF-SHA256), HKDF-SHA256,
 * AES-256-GCM, base mode. The SDK uses the same library, so both sides agree by construction and
 * the RFC vectors in test/unit/hpke.test.ts check the library itself.
 */
export const HPKE_SUITE = new CipherSuite({
  kem: new DhkemP256HkdfSha256(),
  kdf: new HkdfSha256(),
  aead: new Aes256Gcm(),
});

/** Uncompressed SEC1 point (`enc` and public keys) and sealed 32-byte key (32 + 16-byte tag). */
export const HPKE_ENC_BYTES = 65;
export const WRAPPED_KEY_BYTES = 48;

const copy = (bytes: Uint8Array): ArrayBuffer => new Uint8Array(bytes).buffer as ArrayBuffer;
const text = (value: string) => new TextEncoder().encode(value);

/**
 * Seals `plaintext` to a P-256 public point (65 bytes, uncompressed). `ephemeralIkm` fixes the
 * ephemeral key (RFC 9180 DeriveKeyPair) and exists only for the documented test vectors.
 */
export async function hpkeSeal(
  recipientPoint: Uint8Array,
  plaintext: Uint8Array,
  info: string,
  aad: string,
  ephemeralIkm?: Uint8Array,
): Promise<{ enc: Uint8Array; ciphertext: Uint8Array }> {
  const recipientPublicKey = await HPKE_SUITE.kem.deserializePublicKey(copy(recipientPoint));
  const sealed = await HPKE_SUITE.seal(
    { recipientPublicKey, info: text(info), ...(ephemeralIkm ? { ekm: copy(ephemeralIkm) } : {}) },
    copy(plaintext),
    text(aad),
  );
  return { enc: new Uint8Array(sealed.enc), ciphertext: new Uint8Array(sealed.ct) };
}

/** Opens what hpkeSeal made; throws (any error) when the key, enc, info, aad or ciphertext differ. */
export async function hpkeOpen(
  recipientScalar: Uint8Array,
  enc: Uint8Array,
  ciphertext: Uint8Array,
  info: string,
  aad: string,
): Promise<Uint8Array> {
  const recipientKey = await HPKE_SUITE.kem.deserializePrivateKey(copy(recipientScalar));
  const opened = await HPKE_SUITE.open(
    { recipientKey, enc: copy(enc), info: text(info) },
    copy(ciphertext),
    text(aad),
  );
  return new Uint8Array(opened);
}

/** The 32-byte scalar of a P-256 private key kept in the keystore as PKCS#8. */
export function p256ScalarOf(pkcs8: Uint8Array): Uint8Array {
  const key: KeyObject = createPrivateKey({ key: Buffer.from(pkcs8), format: "der", type: "pkcs8" });
  const jwk = key.export({ format: "jwk" });
  if (jwk.kty !== "EC" || jwk.crv !== "P-256" || !jwk.d) throw new Error("not a P-256 private key");
  return new Uint8Array(Buffer.from(jwk.d, "base64url"));
}
