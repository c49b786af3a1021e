/**
 * Sealed files on the device (DESIGN §5 "Sealed file"): read the header from a byte source,
 * then decrypt the payload as a stream, one 64 KiB chunk at a time. Each chunk is AES-256-GCM
 * under K = HKDF-SHA256(DEK, payload_salt, "Service-Sealed-File-v1 payload") with the nonce
 * "11-byte big-endian index ‖ last flag", so a reader notices a missing final chunk (truncation),
 * anything after it (trailing data) and any changed byte (tampering).
 */
import { hkdf } from "@noble/hashes/hkdf.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { b64uDecodeLength, sha256Hex, utf8, utf8Decode } from "./encoding.ts";
import { type SdkErrorCode, verificationError } from "./errors.ts";
import { canonicalize } from "./jcs.ts";

export const SEALED_MAGIC = "SVCSEAL1\n";
export const SEALED_SUITE = "P256-HKDF-SHA256-AES256GCM" as const;
export const SEALED_CHUNK_SIZE = 65_536 as const;
export const MAX_HEADER_LINE_BYTES = 4096;
export const SEALED_INFO = {
  device: "Service-Sealed-File-v1 device",
  payload: "Service-Sealed-File-v1 payload",
} as const;
const TAG = 16;

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

/** Anything that yields bytes: a web stream, an async iterable (Node streams), or bytes in memory. */
export type ByteSource = ReadableStream<Uint8Array> | AsyncIterable<Uint8Array> | Uint8Array;

function fail(code: SdkErrorCode, message: string, details?: Record<string, unknown>): never {
  throw verificationError(code, message, details);
}

/** Buffers just enough of a byte source to hand out exact amounts. */
export class ByteReader {
  private readonly iterator: AsyncIterator<Uint8Array>;
  private parts: Uint8Array[] = [];
  private length = 0;
  private done = false;

  constructor(source: ByteSource) {
    if (source instanceof Uint8Array) {
      const bytes = source;
      this.iterator = (async function* () {
        yield bytes;
      })();
    } else if (typeof (source as ReadableStream<Uint8Array>).getReader === "function") {
      const reader = (source as ReadableStream<Uint8Array>).getReader();
      this.iterator = {
        next: async () => {
          const r = await reader.read();
          return r.done ? { done: true, value: undefined } : { done: false, value: r.value };
        },
        return: async () => {
          await reader.cancel();
          return { done: true, value: undefined };
        },
      };
    } else {
      this.iterator = (source as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
    }
  }

  get buffered(): number {
    return this.length;
  }

  /** Reads until at least `n` bytes are buffered or the source ends; returns what is buffered. */
  async fill(n: number): Promise<number> {
    while (this.length < n && !this.done) {
      const next = await this.iterator.next();
      if (next.done) this.done = true;
      else if (next.value.length > 0) {
        this.parts.push(next.value);
        this.length += next.value.length;
      }
    }
    return this.length;
  }

  /** Takes `n` buffered bytes (fewer only when fewer are buffered). */
  take(n: number): Uint8Array {
    const count = Math.min(n, this.length);
    const out = new Uint8Array(count);
    let offset = 0;
    while (offset < count) {
      const part = this.parts[0] as Uint8Array;
      const used = Math.min(part.length, count - offset);
      out.set(part.subarray(0, used), offset);
      offset += used;
      if (used === part.length) this.parts.shift();
      else this.parts[0] = part.subarray(used);
    }
    this.length -= count;
    return out;
  }

  /** The position of the first `byte` in what is buffered, or -1. */
  indexOf(byte: number): number {
    let offset = 0;
    for (const part of this.parts) {
      const at = part.indexOf(byte);
      if (at !== -1) return offset + at;
      offset += part.length;
    }
    return -1;
  }

  async cancel(): Promise<void> {
    this.done = true;
    this.parts = [];
    this.length = 0;
    await this.iterator.return?.();
  }
}

const ID_TEXT = /^[A-Za-z0-9_-]{1,64}$/;
const FIELDS = [
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

/** Checks a header line as the contract writes it; the same rules as the service's. */
export function parseSealedHeader(line: string): SealedHeader {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    fail("SEALED_FILE_FORMAT", "the sealed-file header is not JSON");
  }
  const bad = (field: string): never =>
    fail("SEALED_FILE_FORMAT", `the sealed-file header's ${field} is invalid`, { field });
  if (typeof value !== "object" || value === null || Array.isArray(value)) return bad("header");
  const h = value as Record<string, unknown>;
  for (const key of Object.keys(h)) if (!FIELDS.includes(key) && key !== "entitlement") bad(key);
  for (const key of FIELDS) if (!(key in h)) bad(key);
  if (h.v !== 1) bad("v");
  if (h.suite !== SEALED_SUITE) bad("suite");
  if (h.chunk_size !== SEALED_CHUNK_SIZE) bad("chunk_size");
  for (const key of ["product_id", "file_id"])
    if (typeof h[key] !== "string" || !ID_TEXT.test(h[key] as string)) bad(key);
  if (typeof h.key_id !== "string" || !/^k_[0-9a-f]{20}$/.test(h.key_id)) bad("key_id");
  if (
    "entitlement" in h &&
    (typeof h.entitlement !== "string" || !/^[a-z0-9][a-z0-9_.:-]{0,63}$/.test(h.entitlement))
  )
    bad("entitlement");
  const sizes: [string, number][] = [
    ["payload_salt", 32],
    ["enc", 65],
    ["wrapped_key", 48],
  ];
  for (const [key, size] of sizes) {
    try {
      b64uDecodeLength(h[key] as string, size);
    } catch {
      bad(key);
    }
  }
  if (canonicalize(h) !== line) bad("header (not canonical JCS)");
  return h as unknown as SealedHeader;
}

/** core = JCS(header without enc and wrapped_key). */
export function sealedCore(header: SealedHeader): string {
  const { enc: _enc, wrapped_key: _wrapped, ...core } = header;
  return canonicalize(core);
}

export interface ReadHeader {
  header: SealedHeader;
  line: string;
  headerSha256: string;
}

/** Reads `SVCSEAL1\n` and the header line from the reader, leaving it at the payload's first byte. */
export async function readSealedHeader(reader: ByteReader): Promise<ReadHeader> {
  const magic = utf8(SEALED_MAGIC);
  await reader.fill(magic.length);
  const start = reader.take(magic.length);
  if (start.length !== magic.length || start.some((byte, i) => byte !== magic[i]))
    fail("SEALED_FILE_FORMAT", "not a sealed file (no SVCSEAL1 marker)");
  let newline = -1;
  while (newline === -1) {
    const buffered = reader.buffered;
    newline = reader.indexOf(0x0a);
    if (newline !== -1) break;
    if (buffered > MAX_HEADER_LINE_BYTES)
      fail("SEALED_FILE_FORMAT", "the sealed-file header line is too long");
    if ((await reader.fill(buffered + 1)) === buffered)
      fail("SEALED_FILE_FORMAT", "the sealed-file header line never ends");
  }
  if (newline > MAX_HEADER_LINE_BYTES) fail("SEALED_FILE_FORMAT", "the sealed-file header line is too long");
  const lineBytes = reader.take(newline);
  reader.take(1);
  let line: string;
  try {
    line = utf8Decode(lineBytes);
  } catch {
    fail("SEALED_FILE_FORMAT", "the sealed-file header is not UTF-8");
  }
  return { header: parseSealedHeader(line), line, headerSha256: sha256Hex(lineBytes) };
}

function chunkNonce(index: number, last: boolean): Uint8Array {
  const nonce = new Uint8Array(12);
  let rest = index;
  for (let i = 10; i >= 0 && rest > 0; i--) {
    nonce[i] = rest % 256;
    rest = Math.floor(rest / 256);
  }
  nonce[11] = last ? 1 : 0;
  return nonce;
}

const buffer = (bytes: Uint8Array): ArrayBuffer => new Uint8Array(bytes).buffer as ArrayBuffer;

/**
 * The plaintext of the payload as a stream. It holds at most two chunks in memory. A failure
 * errors the stream with SEALED_FILE_TRUNCATED, SEALED_FILE_TRAILING_DATA or SEALED_FILE_TAMPERED
 * (details.chunk is the chunk index); the plaintext of a failed chunk is never released.
 */
export function decryptSealedPayload(
  reader: ByteReader,
  header: SealedHeader,
  dek: Uint8Array,
): ReadableStream<Uint8Array> {
  const salt = b64uDecodeLength(header.payload_salt, 32);
  const keyBytes = hkdf(sha256, dek, salt, utf8(SEALED_INFO.payload), 32);
  const key = globalThis.crypto.subtle.importKey("raw", buffer(keyBytes), "AES-GCM", false, ["decrypt"]);
  const segment = SEALED_CHUNK_SIZE + TAG;
  let index = 0;
  const open = async (ciphertext: Uint8Array, last: boolean): Promise<Uint8Array | null> => {
    try {
      const plain = await globalThis.crypto.subtle.decrypt(
        { name: "AES-GCM", iv: buffer(chunkNonce(index, last)), tagLength: 128 },
        await key,
        buffer(ciphertext),
      );
      return new Uint8Array(plain);
    } catch {
      return null;
    }
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        // One byte beyond a full chunk tells whether this chunk is the last.
        if ((await reader.fill(segment + 1)) > segment) {
          const ciphertext = reader.take(segment);
          const plain = await open(ciphertext, false);
          if (!plain) {
            if (await open(ciphertext, true))
              fail("SEALED_FILE_TRAILING_DATA", "data follows the final chunk", { chunk: index });
            fail("SEALED_FILE_TAMPERED", "a chunk of the sealed file fails authentication", { chunk: index });
          }
          controller.enqueue(plain);
          index++;
          return;
        }
        const ciphertext = reader.take(segment);
        // Nothing left: the final chunk is missing. Less than a tag: a cut inside it, which the
        // format cannot tell from tampering (protocol §19).
        if (ciphertext.length === 0)
          fail("SEALED_FILE_TRUNCATED", "the sealed file ends before its final chunk", { chunk: index });
        if (ciphertext.length < TAG)
          fail("SEALED_FILE_TAMPERED", "a chunk of the sealed file fails authentication", { chunk: index });
        const plain = await open(ciphertext, true);
        if (!plain) {
          if (ciphertext.length === segment && (await open(ciphertext, false)))
            fail("SEALED_FILE_TRUNCATED", "the sealed file ends before its final chunk", {
              chunk: index + 1,
            });
          fail("SEALED_FILE_TAMPERED", "a chunk of the sealed file fails authentication", { chunk: index });
        }
        if (plain.length > 0) controller.enqueue(plain);
        controller.close();
      } catch (error) {
        await reader.cancel().catch(() => undefined);
        controller.error(error);
      }
    },
    async cancel() {
      await reader.cancel();
    },
  });
}
