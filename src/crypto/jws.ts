import type { KeyObject } from "node:crypto";
import { b64u } from "./encoding.ts";
import { signEd25519 } from "./keys.ts";

const encodeJson = (value: unknown) => b64u.encode(new TextEncoder().encode(JSON.stringify(value)));

/** RFC 7515 compact serialization with EdDSA (RFC 8037). */
export function signCompactJws(
  header: Record<string, unknown>,
  claims: Record<string, unknown>,
  key: KeyObject,
): string {
  const signingInput = `${encodeJson(header)}.${encodeJson(claims)}`;
  return `${signingInput}.${signEd25519(key, signingInput)}`;
}
