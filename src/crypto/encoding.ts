const B64U_ALPHABET = /^[A-Za-z0-9_-]*$/;

export const b64u = {
  encode: (bytes: Uint8Array): string => Buffer.from(bytes).toString("base64url"),
  /** Lenient (Buffer's): skips unknown characters and ignores unused bits. For our own data only. */
  decode: (text: string): Uint8Array => new Uint8Array(Buffer.from(text, "base64url")),
  /**
   * The bytes of `text` when it is their one canonical spelling (no padding, no other characters,
   * the last character's unused bits zero), else null. Keys and signatures from outside go through
   * this: a lenient decode gives one value several spellings (16 for a 64-byte signature), and
   * anything that hashes or compares the text, an identity or a replay check, would tell them apart.
   */
  decodeCanonical: (text: string): Uint8Array | null => {
    if (!B64U_ALPHABET.test(text)) return null;
    const bytes = new Uint8Array(Buffer.from(text, "base64url"));
    return Buffer.from(bytes).toString("base64url") === text ? bytes : null;
  },
};

// Bun's one-shot hasher: a third less than node:crypto's createHash wrapper, on every response.
export const sha256Hex = (data: string | Uint8Array): string => Bun.CryptoHasher.hash("sha256", data, "hex");
