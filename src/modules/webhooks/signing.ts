import { createHmac, randomBytes } from "node:crypto";

/**
 * Standard Webhooks v1 (DESIGN §5 "Webhooks", docs/protocol.md): the secret is `whsec_` + base64 of
 * 32 random bytes; the HMAC key is those bytes. A signature is `v1,` + base64 HMAC-SHA256 over
 * `id.timestamp.body`; during a rotation the header carries one per live secret, space-separated.
 */
export const SECRET_PREFIX = "whsec_";

export const newSecret = (): string => `${SECRET_PREFIX}${randomBytes(32).toString("base64")}`;

function secretKey(secret: string): Buffer {
  if (!secret.startsWith(SECRET_PREFIX)) throw new Error("not a webhook secret");
  return Buffer.from(secret.slice(SECRET_PREFIX.length), "base64");
}

export function signPayload(secret: string, id: string, timestampSec: number, body: string): string {
  const mac = createHmac("sha256", secretKey(secret))
    .update(`${id}.${timestampSec}.${body}`)
    .digest("base64");
  return `v1,${mac}`;
}

/** The three headers of one attempt; `secrets` lists every secret that signs now, newest first. */
export function signatureHeaders(
  secrets: readonly string[],
  id: string,
  timestampSec: number,
  body: string,
): Record<string, string> {
  return {
    "webhook-id": id,
    "webhook-timestamp": String(timestampSec),
    "webhook-signature": secrets.map((secret) => signPayload(secret, id, timestampSec, body)).join(" "),
  };
}
