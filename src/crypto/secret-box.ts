import { createCipheriv, createDecipheriv, createHmac, hkdfSync, randomBytes } from "node:crypto";

/**
 * Encrypts secrets at rest (license keys, later webhook and TOTP secrets) with the keystore's data
 * key, and gives each an HMAC for lookup so no query ever needs the plaintext.
 */
export class SecretBox {
  private readonly encryptionKey: Buffer;
  private readonly lookupKey: Buffer;

  constructor(dataKey: Uint8Array) {
    this.encryptionKey = Buffer.from(hkdfSync("sha256", dataKey, "", "licensing data-key encryption v1", 32));
    this.lookupKey = Buffer.from(hkdfSync("sha256", dataKey, "", "licensing data-key lookup v1", 32));
  }

  /** `v1.` + base64url(nonce | ciphertext | tag); `context` binds the value to its row (AAD). */
  encrypt(plaintext: string, context: string): string {
    const nonce = randomBytes(12);
    const cipher = createCipheriv("aes-256-gcm", this.encryptionKey, nonce);
    cipher.setAAD(Buffer.from(context));
    const body = Buffer.concat([
      nonce,
      cipher.update(plaintext, "utf8"),
      cipher.final(),
      cipher.getAuthTag(),
    ]);
    return `v1.${body.toString("base64url")}`;
  }

  decrypt(sealed: string, context: string): string {
    if (!sealed.startsWith("v1.")) throw new Error("unknown secret encoding");
    const body = Buffer.from(sealed.slice(3), "base64url");
    const decipher = createDecipheriv("aes-256-gcm", this.encryptionKey, body.subarray(0, 12));
    decipher.setAAD(Buffer.from(context));
    decipher.setAuthTag(body.subarray(body.length - 16));
    return Buffer.concat([decipher.update(body.subarray(12, body.length - 16)), decipher.final()]).toString(
      "utf8",
    );
  }

  /** `purpose` is a constant of ours and never holds NUL, so the first NUL frames it unambiguously. */
  lookupHash(value: string, purpose: string): string {
    return createHmac("sha256", this.lookupKey).update(`${purpose}\0${value}`).digest("hex");
  }
}
