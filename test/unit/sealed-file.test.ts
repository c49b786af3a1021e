import { afterAll, describe, expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { b64u } from "../../src/crypto/encoding.ts";
import { hpkeOpen, p256ScalarOf } from "../../src/crypto/hpke.ts";
import { keyIdOf, publicKeyText } from "../../src/crypto/keys.ts";
import {
  chunkNonce,
  parseSealedHeader,
  parseSealingKeyLine,
  SEALED_CHUNK_SIZE,
  SEALED_INFO,
  sealedCore,
  sealFile,
  sealingKeyLine,
} from "../../src/crypto/sealed-file.ts";
import { SdkError } from "../../src/sdk/index.ts";
import { ByteReader, decryptSealedPayload, readSealedHeader } from "../../src/sdk/sealed.ts";

/**
 * The sealed-file format on its own: the sealing tool's output opened by the SDK's streaming
 * reader, with the product key standing in for the service's key release.
 */
const dir = mkdtempSync(join(tmpdir(), "sealed-file-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const pair = generateKeyPairSync("ec", { namedCurve: "P-256" });
const publicText = publicKeyText(pair.publicKey);
const point = b64u.decode(publicText.slice("p256:".length));
const scalar = p256ScalarOf(new Uint8Array(pair.privateKey.export({ format: "der", type: "pkcs8" })));
const PRODUCT = "prod_01JZ8X4M6Q2T9V3B7N5K1R0W8Y";
const line = sealingKeyLine(PRODUCT, keyIdOf(publicText), point);

const pattern = (size: number) => new Uint8Array(size).map((_, i) => (i * 7 + 3) % 256);

async function seal(plain: Uint8Array, entitlement?: string): Promise<Uint8Array> {
  const input = join(dir, `in-${Math.random()}`);
  const output = `${input}.sealed`;
  writeFileSync(input, plain);
  await sealFile(input, output, parseSealingKeyLine(line), entitlement ? { entitlement } : {});
  return new Uint8Array(readFileSync(output));
}

/** What the service does at key release: open the data key with the product key, aad = core. */
async function open(sealed: Uint8Array): Promise<Uint8Array> {
  const reader = new ByteReader(sealed);
  const { header } = await readSealedHeader(reader);
  const dek = await hpkeOpen(
    scalar,
    b64u.decode(header.enc),
    b64u.decode(header.wrapped_key),
    SEALED_INFO.product,
    sealedCore(header),
  );
  return new Uint8Array(await new Response(decryptSealedPayload(reader, header, dek)).arrayBuffer());
}

async function refusal(sealed: Uint8Array): Promise<SdkError> {
  try {
    await open(sealed);
  } catch (error) {
    if (error instanceof SdkError) return error;
    throw error;
  }
  throw new Error("expected the reader to refuse");
}

const headerLength = (sealed: Uint8Array) => sealed.indexOf(0x0a, 9) + 1;

describe("sealing and opening", () => {
  test.each([
    0,
    1,
    1000,
    SEALED_CHUNK_SIZE - 1,
    SEALED_CHUNK_SIZE,
    SEALED_CHUNK_SIZE + 1,
    2 * SEALED_CHUNK_SIZE,
    200_000,
  ])("a file of %p bytes comes back byte for byte", async (size) => {
    const plain = pattern(size);
    const sealed = await seal(plain);
    const chunks = size === 0 ? 1 : Math.ceil(size / SEALED_CHUNK_SIZE);
    expect(sealed.length - headerLength(sealed)).toBe(size + 16 * chunks);
    expect(await open(sealed)).toEqual(plain);
  });

  test("a file larger than the chunk size streams out one chunk at a time", async () => {
    const plain = pattern(3 * SEALED_CHUNK_SIZE + 123);
    const sealed = await seal(plain);
    const reader = new ByteReader(sealed);
    const { header } = await readSealedHeader(reader);
    const dek = await hpkeOpen(
      scalar,
      b64u.decode(header.enc),
      b64u.decode(header.wrapped_key),
      SEALED_INFO.product,
      sealedCore(header),
    );
    const sizes: number[] = [];
    const streamReader = decryptSealedPayload(reader, header, dek).getReader();
    for (;;) {
      const { done, value } = await streamReader.read();
      if (done) break;
      sizes.push(value.length);
    }
    expect(sizes).toEqual([SEALED_CHUNK_SIZE, SEALED_CHUNK_SIZE, SEALED_CHUNK_SIZE, 123]);
  });

  test("the header is canonical JCS with the contract's fields, and names the entitlement when given", async () => {
    const sealed = await seal(pattern(10), "pro.export");
    const text = new TextDecoder().decode(sealed.subarray(0, headerLength(sealed)));
    expect(text.startsWith("SVCSEAL1\n")).toBe(true);
    const parsed = parseSealedHeader(text.slice(9, -1));
    if (!parsed.ok) throw new Error(parsed.problem);
    expect(Object.keys(parsed.header).sort()).toEqual(
      [
        "chunk_size",
        "enc",
        "entitlement",
        "file_id",
        "key_id",
        "payload_salt",
        "product_id",
        "suite",
        "v",
        "wrapped_key",
      ].sort(),
    );
    expect(parsed.header).toMatchObject({
      v: 1,
      suite: "P256-HKDF-SHA256-AES256GCM",
      product_id: PRODUCT,
      chunk_size: 65536,
      entitlement: "pro.export",
    });
    expect(b64u.decode(parsed.header.wrapped_key)).toHaveLength(48);
  });

  test("two sealings of the same file share nothing: new data key, salt and file id", async () => {
    const a = await seal(pattern(100));
    const b = await seal(pattern(100));
    expect(Buffer.from(a).equals(Buffer.from(b))).toBe(false);
    expect(await open(a)).toEqual(await open(b));
  });
});

describe("a damaged file is refused where the damage is", () => {
  test("flipping any byte of a small payload is refused as tampering of chunk 0", async () => {
    const sealed = await seal(pattern(64));
    const start = headerLength(sealed);
    for (let at = start; at < sealed.length; at++) {
      const copy = sealed.slice();
      copy[at] = (copy[at] ?? 0) ^ 0x40;
      const error = await refusal(copy);
      expect(`${at}:${error.code}:${error.details.chunk}`).toBe(`${at}:SEALED_FILE_TAMPERED:0`);
    }
  });

  test("a flipped byte in a later chunk names that chunk", async () => {
    const sealed = await seal(pattern(3 * SEALED_CHUNK_SIZE + 10));
    const start = headerLength(sealed);
    for (const chunk of [0, 1, 2, 3]) {
      const copy = sealed.slice();
      const at = start + chunk * (SEALED_CHUNK_SIZE + 16) + (chunk === 3 ? 5 : 40_000);
      copy[at] = (copy[at] ?? 0) ^ 1;
      const error = await refusal(copy);
      expect([error.code, error.details.chunk]).toEqual(["SEALED_FILE_TAMPERED", chunk]);
    }
  });

  test("swapping two chunks is refused: each chunk is bound to its position", async () => {
    const sealed = await seal(pattern(3 * SEALED_CHUNK_SIZE));
    const start = headerLength(sealed);
    const seg = SEALED_CHUNK_SIZE + 16;
    const copy = sealed.slice();
    copy.set(sealed.subarray(start + seg, start + 2 * seg), start);
    copy.set(sealed.subarray(start, start + seg), start + seg);
    expect((await refusal(copy)).code).toBe("SEALED_FILE_TAMPERED");
  });

  test("a file cut at a chunk boundary is refused as truncated", async () => {
    const sealed = await seal(pattern(2 * SEALED_CHUNK_SIZE + 500));
    const cut = headerLength(sealed) + 2 * (SEALED_CHUNK_SIZE + 16);
    const error = await refusal(sealed.subarray(0, cut));
    expect([error.code, error.details.chunk]).toEqual(["SEALED_FILE_TRUNCATED", 2]);
  });

  test("a file with its header and no payload is refused as truncated", async () => {
    const sealed = await seal(pattern(10));
    expect((await refusal(sealed.subarray(0, headerLength(sealed)))).code).toBe("SEALED_FILE_TRUNCATED");
  });

  test("a cut inside the final chunk reads as tampering, even one that leaves less than its tag", async () => {
    // The format does not record the payload length: a final chunk cut short is a chunk that
    // fails authentication, however few of its bytes are left; only none left is a missing chunk.
    for (const [size, cut] of [
      [6, 1],
      [6, 16],
      [0, 1],
      [0, 15],
      [SEALED_CHUNK_SIZE + 6, 20],
    ] as const) {
      const sealed = await seal(pattern(size));
      const error = await refusal(sealed.subarray(0, sealed.length - cut));
      const chunk = size > SEALED_CHUNK_SIZE ? 1 : 0;
      expect(`${size}-${cut}:${error.code}:${error.details.chunk}`).toBe(
        `${size}-${cut}:SEALED_FILE_TAMPERED:${chunk}`,
      );
    }
  });

  test("data after a full-size final chunk is refused as trailing data", async () => {
    const one = await seal(pattern(SEALED_CHUNK_SIZE));
    const error = await refusal(new Uint8Array([...one, 0]));
    expect([error.code, error.details.chunk]).toEqual(["SEALED_FILE_TRAILING_DATA", 0]);
    const two = await seal(pattern(2 * SEALED_CHUNK_SIZE));
    const appended = new Uint8Array([...two, ...two.subarray(headerLength(two))]);
    const later = await refusal(appended);
    expect([later.code, later.details.chunk]).toEqual(["SEALED_FILE_TRAILING_DATA", 1]);
  });

  test("data after a short final chunk is refused too, as a damaged final chunk", async () => {
    // The format does not record the payload length, so the bytes that follow a short final
    // chunk read as part of it; the chunk then fails authentication and nothing is released.
    const sealed = await seal(pattern(1000));
    const error = await refusal(new Uint8Array([...sealed, 1, 2, 3]));
    expect([error.code, error.details.chunk]).toEqual(["SEALED_FILE_TAMPERED", 0]);
  });

  test("a changed marker or an unreadable header line is refused before any key is asked for", async () => {
    const sealed = await seal(pattern(10));
    const marker = sealed.slice();
    marker[3] = 0x21;
    expect((await refusal(marker)).code).toBe("SEALED_FILE_FORMAT");
    const header = sealed.slice();
    header[9] = 0x5b; // the header's opening brace becomes a bracket
    expect((await refusal(header)).code).toBe("SEALED_FILE_FORMAT");
    const noNewline = new TextEncoder().encode(`SVCSEAL1\n${"x".repeat(5000)}`);
    expect((await refusal(noNewline)).code).toBe("SEALED_FILE_FORMAT");
  });

  test("a header changed in a way that still parses no longer opens its data key", async () => {
    const sealed = await seal(pattern(10));
    const text = new TextDecoder().decode(sealed.subarray(0, headerLength(sealed)));
    const fileId = /"file_id":"([^"]+)"/.exec(text)?.[1] ?? "";
    const altered = text.replace(fileId, `${fileId.slice(0, -1)}${fileId.endsWith("A") ? "B" : "A"}`);
    const copy = new Uint8Array([
      ...new TextEncoder().encode(altered),
      ...sealed.subarray(headerLength(sealed)),
    ]);
    await expect(open(copy)).rejects.toThrow();
  });
});

describe("the header and the sealing key line", () => {
  test("a header with an unknown field, a wrong suite, a short wrapped key or non-canonical spacing is refused", async () => {
    const sealed = await seal(pattern(1));
    const text = new TextDecoder().decode(sealed.subarray(9, headerLength(sealed) - 1));
    const header = JSON.parse(text);
    const problem = (value: unknown) => {
      const parsed = parseSealedHeader(typeof value === "string" ? value : JSON.stringify(value));
      return parsed.ok ? null : parsed.field;
    };
    expect(problem(text)).toBeNull();
    expect(problem({ ...header, extra: 1 })).toBe("extra");
    expect(problem({ ...header, suite: "X25519" })).toBe("suite");
    expect(problem({ ...header, chunk_size: 1024 })).toBe("chunk_size");
    expect(problem({ ...header, wrapped_key: b64u.encode(new Uint8Array(47)) })).toBe("wrapped_key");
    expect(problem({ ...header, enc: b64u.encode(new Uint8Array(65)) })).toBe("enc");
    expect(problem(JSON.stringify(header, null, 1))).toBe("header");
  });

  test("the sealing key line must carry the key id of its own point", () => {
    const parsed = parseSealingKeyLine(line);
    expect(parsed.productId).toBe(PRODUCT);
    expect(() => parseSealingKeyLine(line.replace(/k_[0-9a-f]{4}/, "k_0000"))).toThrow(/key id/);
    expect(() => parseSealingKeyLine(line.replace("service-sealing-key-v1:", ""))).toThrow(/starts with/);
    expect(() => parseSealingKeyLine(`${line}:extra`)).toThrow();
  });

  test("chunk nonces are the 11-byte big-endian index and the last flag", () => {
    expect(chunkNonce(0, false).toString("hex")).toBe("000000000000000000000000");
    expect(chunkNonce(1, true).toString("hex")).toBe("000000000000000000000101");
    expect(chunkNonce(0x010203, false).toString("hex")).toBe("000000000000000001020300");
  });
});
