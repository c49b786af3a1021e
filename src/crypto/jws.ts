import type { KeyObject } from "node:crypto";
import { signEd25519 } from "./keys.ts";

const encodeJson = (value: unknown) => Buffer.from(JSON.stringify(value)).toString("base64url");

/** RFC 7515 compact serialization with EdDSA (RFC 8037). */
export function signCompactJws(
  header: Record<string, unknown>,
  claims: Record<string, unknown>,
  key: KeyObject,
): string {
  const signingInput = `${encodeJson(header)}.${encodeJson(claims)}`;
  return `${signingInput}.${signEd25519(key, signingInput)}`;
}
