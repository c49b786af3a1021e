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

/**
 * The claims of a compact JWS this service signed and stored itself, unverified: for reading back
 * our own records only, never for anything a client sent.
 */
export function claimsOfOwnJws(jws: string): Record<string, unknown> {
  const [, payload] = jws.split(".");
  if (payload === undefined) throw new Error("a stored JWS has no payload");
  return JSON.parse(Buffer.from(payload, "base64url").toString("utf8")) as Record<string, unknown>;
}
