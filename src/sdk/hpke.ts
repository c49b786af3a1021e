/**
 * HPKE (RFC 9180) on the device, in the contract's suite: DHKEM(P-256, HKDF-SHA256), HKDF-SHA256,
 * AES-256-GCM, base mode. @hpke/core runs on Web Crypto, so this works in browsers too.
 */
import { Aes256Gcm, CipherSuite, DhkemP256HkdfSha256, HkdfSha256 } from "@hpke/core";

let suite: CipherSuite | undefined;
const hpkeSuite = (): CipherSuite => {
  suite ??= new CipherSuite({ kem: new DhkemP256HkdfSha256(), kdf: new HkdfSha256(), aead: new Aes256Gcm() });
  return suite;
};

const buffer = (bytes: Uint8Array): ArrayBuffer => new Uint8Array(bytes).buffer as ArrayBuffer;
const text = (value: string) => new TextEncoder().encode(value);

/** Opens a sealed message with the recipient's 32-byte P-256 scalar; throws when anything differs. */
export async function hpkeOpen(
  recipientScalar: Uint8Array,
  enc: Uint8Array,
  ciphertext: Uint8Array,
  info: string,
  aad: string,
): Promise<Uint8Array> {
  const s = hpkeSuite();
  const recipientKey = await s.kem.deserializePrivateKey(buffer(recipientScalar));
  return new Uint8Array(
    await s.open({ recipientKey, enc: buffer(enc), info: text(info) }, buffer(ciphertext), text(aad)),
  );
}
