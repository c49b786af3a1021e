import { createCipheriv, createPublicKey, hkdfSync, randomBytes } from "node:crypto";
import { type FileHandle, open } from "node:fs/promises";
import { ENTITLEMENT_NAME, ENTITLEMENT_NAME_RULE } from "../domain/entitlements.ts";
import { AtomicFile } from "../fs/atomic-file.ts";
import { b64u, sha256Hex } from "./encoding.ts";
import { HPKE_ENC_BYTES, hpkeSeal, WRAPPED_KEY_BYTES } from "./hpke.ts";
import { canonicalize } from "./jcs.ts";
import { KEY_ID, keyIdOf } from "./keys.ts";

/**
 * The sealed-file format of DESIGN §5 (contract): `"SVCSEAL1\n"` + header line + `"\n"` +
 * payload. The header line is JCS(H); the data key (DEK) is HPKE-sealed to the product sealing
 * key; the payload is AES-256-GCM chunks under a key derived from the DEK. The sealing tool
 * writes it, the SDK opens it, and the service only ever sees the header.
 */
export const SEALED_MAGIC = "SVCSEAL1\n";
export const SEALED_SUITE = "P256-HKDF-SHA256-AES256GCM" as const;
export const SEALED_CHUNK_SIZE = 65_536 as const;
export const GCM_TAG_BYTES = 16;
/** Far above any real header (~500 bytes), so a reader can refuse junk before buffering much. */
export const MAX_HEADER_LINE_BYTES = 4096;
export const SEALED_INFO = {
  product: "Service-Sealed-File-v1 product",
  device: "Service-Sealed-File-v1 device",
  payload: "Service-Sealed-File-v1 payload",
} as const;
export const SEALING_KEY_PREFIX = "service-sealing-key-v1:";
const DEK_BYTES = 32;
const SALT_BYTES = 32;

export interface SealedHeader {
  v: 1;
  suite: typeof SEALED_SUITE;
  product_id: string;
  key_id: string;
  file_id: string;
  entitlement?: string;
  chunk_size: typeof SEALED_CHUNK_SIZE;
  payload_salt: string;
  enc: string;
  wrapped_key: string;
}

const ID_TEXT = /^[A-Za-z0-9_-]{1,64}$/;
const REQUIRED = [
  "v",
  "suite",
  "product_id",
  "key_id",
  "file_id",
  "chunk_size",
  "payload_salt",
  "enc",
  "wrapped_key",
];

/** Decodes canonical base64url of exactly `length` bytes; null otherwise. */
function fixedB64u(value: unknown, length: number): Uint8Array | null {
  if (typeof value !== "string") return null;
  const bytes = b64u.decodeCanonical(value);
  return bytes?.length === length ? bytes : null;
}

/** `core` = JCS(H without enc and wrapped_key): the associated data of the product-key wrap. */
export function sealedCore(header: SealedHeader | Omit<SealedHeader, "enc" | "wrapped_key">): string {
  const { enc: _enc, wrapped_key: _wrapped, ...core } = header as SealedHeader;
  return canonicalize(core);
}

export type HeaderProblem = { ok: false; field: string; problem: string };

/**
 * Reads a header line (without the magic and the newline) as the contract writes it. The line must
 * be exactly JCS of its own value, so `header_sha256` names one header and nothing can be smuggled
 * in through formatting.
 */
export function parseSealedHeader(line: string): { ok: true; header: SealedHeader } | HeaderProblem {
  const bad = (field: string, problem: string): HeaderProblem => ({ ok: false, field, problem });
  if (Buffer.byteLength(line) > MAX_HEADER_LINE_BYTES) return bad("header", "is too long");
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    return bad("header", "is not JSON");
  }
  if (typeof value !== "object" || value === null || Array.isArray(value))
    return bad("header", "is not an object");
  const h = value as Record<string, unknown>;
  for (const field of Object.keys(h)) {
    if (!REQUIRED.includes(field) && field !== "entitlement") return bad(field, "is not a header field");
  }
  for (const field of REQUIRED) if (!Object.hasOwn(h, field)) return bad(field, "is missing");
  if (h.v !== 1) return bad("v", "must be 1");
  if (h.suite !== SEALED_SUITE) return bad("suite", `must be ${SEALED_SUITE}`);
  if (typeof h.product_id !== "string" || !ID_TEXT.test(h.product_id))
    return bad("product_id", "is malformed");
  if (typeof h.key_id !== "string" || !KEY_ID.test(h.key_id)) return bad("key_id", "is malformed");
  if (typeof h.file_id !== "string" || !ID_TEXT.test(h.file_id)) return bad("file_id", "is malformed");
  if (
    Object.hasOwn(h, "entitlement") &&
    (typeof h.entitlement !== "string" || !ENTITLEMENT_NAME.test(h.entitlement))
  )
    return bad("entitlement", "is not an entitlement name");
  if (h.chunk_size !== SEALED_CHUNK_SIZE) return bad("chunk_size", `must be ${SEALED_CHUNK_SIZE}`);
  if (!fixedB64u(h.payload_salt, SALT_BYTES)) return bad("payload_salt", "must be b64u of 32 bytes");
  const enc = fixedB64u(h.enc, HPKE_ENC_BYTES);
  if (enc?.[0] !== 4) return bad("enc", "must be b64u of a 65-byte uncompressed P-256 point");
  if (!fixedB64u(h.wrapped_key, WRAPPED_KEY_BYTES)) return bad("wrapped_key", "must be b64u of 48 bytes");
  if (canonicalize(h) !== line) return bad("header", "is not in canonical (JCS) form");
  return { ok: true, header: h as unknown as SealedHeader };
}

/** hex SHA-256 of the header line's bytes, as `sealed-file-keys` echoes it. */
export const headerSha256 = (line: string): string => sha256Hex(line);

/** The one-line public sealing key the sealing tool takes. */
export const sealingKeyLine = (productId: string, keyId: string, point: Uint8Array): string =>
  `${SEALING_KEY_PREFIX}${productId}:${keyId}:${b64u.encode(point)}`;

export interface SealingKey {
  productId: string;
  keyId: string;
  point: Uint8Array;
}

/** Parses a sealing-key line; the key id must be the one of its point, which catches typos. */
export function parseSealingKeyLine(line: string): SealingKey {
  const text = line.trim();
  if (!text.startsWith(SEALING_KEY_PREFIX))
    throw new Error(`a sealing key starts with "${SEALING_KEY_PREFIX}"`);
  const parts = text.slice(SEALING_KEY_PREFIX.length).split(":");
  const [productId, keyId, encoded] = parts;
  if (parts.length !== 3 || !productId || !keyId || !encoded || !ID_TEXT.test(productId))
    throw new Error("a sealing key is service-sealing-key-v1:<product_id>:<key_id>:<public key>");
  const point = fixedB64u(encoded, HPKE_ENC_BYTES);
  if (point?.[0] !== 4) throw new Error("the sealing key's public key is not a 65-byte P-256 point");
  if (keyIdOf(`p256:${encoded}`) !== keyId)
    throw new Error("the sealing key's key id does not match its public key");
  // Otherwise a point off the curve (its key id made to match) fails only when sealing starts.
  if (!onP256(point)) throw new Error("the public key is not a point on P-256");
  return { productId, keyId, point };
}

/** Whether a 65-byte uncompressed point lies on P-256: the JWK import checks the curve equation. */
function onP256(point: Uint8Array): boolean {
  const coordinate = (from: number) => b64u.encode(point.subarray(from, from + 32));
  try {
    createPublicKey({ key: { kty: "EC", crv: "P-256", x: coordinate(1), y: coordinate(33) }, format: "jwk" });
    return true;
  } catch {
    return false;
  }
}

/** K = HKDF-SHA256(DEK, salt = payload_salt, info = "Service-Sealed-File-v1 payload", 32). */
export const payloadKey = (dek: Uint8Array, salt: Uint8Array): Buffer =>
  Buffer.from(hkdfSync("sha256", dek, salt, SEALED_INFO.payload, 32));

/** Chunk nonce: the 11-byte big-endian chunk index, then 1 for the last chunk and 0 otherwise. */
export function chunkNonce(index: number, last: boolean): Buffer {
  const nonce = Buffer.alloc(12);
  let rest = index;
  for (let i = 10; i >= 0 && rest > 0; i--) {
    nonce[i] = rest % 256;
    rest = Math.floor(rest / 256);
  }
  nonce[11] = last ? 1 : 0;
  return nonce;
}

export function encryptChunk(key: Buffer, index: number, last: boolean, plaintext: Uint8Array): Buffer {
  const cipher = createCipheriv("aes-256-gcm", key, chunkNonce(index, last));
  return Buffer.concat([cipher.update(plaintext), cipher.final(), cipher.getAuthTag()]);
}

export interface SealOptions {
  entitlement?: string;
  /** Fixed values, for the documented test vector only. */
  fixed?: { dek: Uint8Array; payloadSalt: Uint8Array; fileId: string; ephemeralIkm: Uint8Array };
}

/** Builds the header for a new file: a fresh DEK, HPKE-sealed to the product key with aad = core. */
export async function newSealedHeader(
  key: SealingKey,
  options: SealOptions = {},
): Promise<{ header: SealedHeader; line: string; dek: Uint8Array }> {
  if (options.entitlement !== undefined && !ENTITLEMENT_NAME.test(options.entitlement))
    throw new Error(`the entitlement must be ${ENTITLEMENT_NAME_RULE}`);
  const dek = options.fixed?.dek ?? new Uint8Array(randomBytes(DEK_BYTES));
  const salt = options.fixed?.payloadSalt ?? new Uint8Array(randomBytes(SALT_BYTES));
  const core = {
    v: 1 as const,
    suite: SEALED_SUITE,
    product_id: key.productId,
    key_id: key.keyId,
    file_id: options.fixed?.fileId ?? b64u.encode(randomBytes(16)),
    ...(options.entitlement === undefined ? {} : { entitlement: options.entitlement }),
    chunk_size: SEALED_CHUNK_SIZE,
    payload_salt: b64u.encode(salt),
  };
  const wrapped = await hpkeSeal(
    key.point,
    dek,
    SEALED_INFO.product,
    sealedCore(core),
    options.fixed?.ephemeralIkm,
  );
  const header: SealedHeader = {
    ...core,
    enc: b64u.encode(wrapped.enc),
    wrapped_key: b64u.encode(wrapped.ciphertext),
  };
  return { header, line: canonicalize(header), dek };
}

/**
 * Reads up to `buffer.length` bytes, fewer only at the end of the file. Awaited, not sync: the
 * input may be a pipe that waits for its writer, and a signal's handler (which removes the partial
 * output) runs only when the event loop turns.
 */
async function readFull(input: FileHandle, buffer: Buffer): Promise<number> {
  let filled = 0;
  while (filled < buffer.length) {
    const { bytesRead } = await input.read(buffer, filled, buffer.length - filled, null);
    if (bytesRead === 0) break;
    filled += bytesRead;
  }
  return filled;
}

/**
 * Seals the file `input` into `output`, streaming: two chunk buffers whatever the file's size.
 * The output appears under its name only when complete ({@link AtomicFile}); a failure to write it
 * is a FileWriteError.
 */
export async function sealFile(
  input: string,
  output: string,
  key: SealingKey,
  options: SealOptions = {},
): Promise<{ header: SealedHeader; headerSha256: string; plaintextBytes: number; chunks: number }> {
  const { header, line, dek } = await newSealedHeader(key, options);
  const payload = payloadKey(dek, b64u.decode(header.payload_salt));
  const source = await open(input, "r");
  let file: AtomicFile | undefined;
  try {
    file = new AtomicFile(output);
    file.write(Buffer.from(`${SEALED_MAGIC}${line}\n`));
    // One chunk is held back until the next read shows whether it is the last.
    let current = Buffer.alloc(SEALED_CHUNK_SIZE);
    let next = Buffer.alloc(SEALED_CHUNK_SIZE);
    let currentLength = await readFull(source, current);
    let index = 0;
    let total = 0;
    for (;;) {
      const nextLength = currentLength < SEALED_CHUNK_SIZE ? 0 : await readFull(source, next);
      const last = nextLength === 0;
      file.write(encryptChunk(payload, index, last, current.subarray(0, currentLength)));
      total += currentLength;
      index++;
      if (last) break;
      [current, next] = [next, current];
      currentLength = nextLength;
    }
    file.commit();
    return { header, headerSha256: headerSha256(line), plaintextBytes: total, chunks: index };
  } catch (error) {
    file?.discard();
    throw error;
  } finally {
    await source.close();
  }
}
