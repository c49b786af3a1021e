export const b64u = {
  encode: (bytes: Uint8Array): string => Buffer.from(bytes).toString("base64url"),
  decode: (text: string): Uint8Array => new Uint8Array(Buffer.from(text, "base64url")),
};

// Bun's one-shot hasher: a third less than node:crypto's createHash wrapper, on every response.
export const sha256Hex = (data: string | Uint8Array): string => Bun.CryptoHasher.hash("sha256", data, "hex");
