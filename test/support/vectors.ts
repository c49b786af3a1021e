import { createECDH, createPrivateKey, type KeyObject } from "node:crypto";
import { b64u } from "../../src/crypto/encoding.ts";
import { ed25519FromSeed } from "../../src/crypto/keys.ts";

/**
 * Fixed keys and the reader of the test vectors in docs/protocol.md. Every vector is a fenced block
 * whose info string is `json vector=<name>` and whose body is one JSON object.
 */

/** A 32-byte value of one repeated byte, as lowercase hex (the vectors' seeds and scalars). */
export const repeatedByteHex = (byte: number): string => Buffer.alloc(32, byte).toString("hex");

/** An Ed25519 private key from a hex seed. */
export const ed25519FromHex = (seedHex: string): KeyObject => ed25519FromSeed(hexBytes(seedHex, 32));

/** A P-256 private key from a hex scalar, with its 65-byte uncompressed public point. */
export function p256FromHex(scalarHex: string): { privateKey: KeyObject; point: Uint8Array } {
  const scalar = hexBytes(scalarHex, 32);
  const ecdh = createECDH("prime256v1");
  ecdh.setPrivateKey(scalar);
  const point = new Uint8Array(ecdh.getPublicKey());
  const privateKey = createPrivateKey({
    key: {
      kty: "EC",
      crv: "P-256",
      x: b64u.encode(point.subarray(1, 33)),
      y: b64u.encode(point.subarray(33)),
      d: b64u.encode(scalar),
    },
    format: "jwk",
  });
  return { privateKey, point };
}

function hexBytes(hex: string, length: number): Uint8Array {
  if (!new RegExp(`^[0-9a-f]{${length * 2}}$`).test(hex)) throw new Error(`expected ${length} bytes of hex`);
  return new Uint8Array(Buffer.from(hex, "hex"));
}

const VECTOR_BLOCK = /^```json vector=([^\s`]*)[^\n]*\n([\s\S]*?)^```[ \t]*$/gm;
const VECTOR_NAME = /^[a-z0-9][a-z0-9-]*$/;

/**
 * Every vector block of a Markdown document, by name. Throws on a malformed name, a duplicate, a
 * body that is not JSON, or a body that is not an object, so the caller cannot miss a broken block.
 */
export function readVectors(markdown: string): Map<string, Record<string, unknown>> {
  const vectors = new Map<string, Record<string, unknown>>();
  for (const match of markdown.matchAll(VECTOR_BLOCK)) {
    const name = match[1] ?? "";
    if (!VECTOR_NAME.test(name)) throw new Error(`vector block with a malformed name: "${name}"`);
    if (vectors.has(name)) throw new Error(`vector "${name}" appears twice`);
    let parsed: unknown;
    try {
      parsed = JSON.parse(match[2] ?? "");
    } catch (error) {
      throw new Error(`vector "${name}" is not JSON: ${(error as Error).message}`);
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed))
      throw new Error(`vector "${name}" is not a JSON object`);
    vectors.set(name, parsed as Record<string, unknown>);
  }
  const opened = markdown.match(/^```json vector=/gm)?.length ?? 0;
  if (opened !== vectors.size) throw new Error(`${opened - vectors.size} vector block(s) could not be read`);
  return vectors;
}
