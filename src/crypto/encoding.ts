import { createHash } from "node:crypto";

export const b64u = {
  encode: (bytes: Uint8Array): string => Buffer.from(bytes).toString("base64url"),
  decode: (text: string): Uint8Array => new Uint8Array(Buffer.from(text, "base64url")),
};

export const sha256Hex = (data: string | Uint8Array): string =>
  createHash("sha256").update(data).digest("hex");
