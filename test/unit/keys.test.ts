import { describe, expect, test } from "bun:test";
import { createHash, generateKeyPairSync, sign } from "node:crypto";
import { ed25519 } from "@noble/curves/ed25519.js";
import {
  ED25519_SMALL_ORDER_Y,
  isOnCurve,
  type PublicKeyInfo,
  parsePublicKey,
  publicKeyText,
  verifySignature,
} from "../../src/crypto/keys.ts";

const b64u = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64url");

test("a small-order Ed25519 key is refused, so a forged all-zero signature can never verify for it", () => {
  const identity = new Uint8Array(32);
  identity[0] = 1;
  expect(parsePublicKey(`ed25519:${b64u(identity)}`)).toBeNull();
  // Another small-order point: the encoding of order-2 point (0, -1).
  const orderTwo = new Uint8Array(32).fill(0xff);
  orderTwo[0] = 0xec;
  orderTwo[31] = 0x7f;
  expect(parsePublicKey(`ed25519:${b64u(orderTwo)}`)).toBeNull();
});

test("a proper Ed25519 key parses and verifies its own signature only", () => {
  const { publicKey } = generateKeyPairSync("ed25519");
  const info = parsePublicKey(publicKeyText(publicKey));
  expect(info?.alg).toBe("ed25519");
  const forged = new Uint8Array(64);
  forged[0] = 1;
  expect(verifySignature(info as NonNullable<typeof info>, "any message", b64u(forged))).toBe(false);
});

test("malformed key strings are refused: bad prefix, bad length, non-canonical base64url, off-curve P-256", () => {
  const { publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const p256 = publicKeyText(publicKey);
  expect(parsePublicKey(p256)?.alg).toBe("p256");
  const point = Buffer.from(p256.slice(5), "base64url");
  point[64] = (point[64] as number) ^ 1;
  expect(parsePublicKey(`p256:${b64u(point)}`)).toBeNull();
  expect(parsePublicKey("rsa:AAAA")).toBeNull();
  expect(parsePublicKey(`ed25519:${b64u(new Uint8Array(31))}`)).toBeNull();
  expect(parsePublicKey(`${p256}=`)).toBeNull();
});

describe("Ed25519 keys are judged by their bytes, without decoding the point", () => {
  const P = (1n << 255n) - 19n;
  const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex");
  const le = (n: bigint) => Uint8Array.from(Buffer.from(n.toString(16).padStart(64, "0"), "hex").reverse());
  const text = (bytes: Uint8Array) => `ed25519:${b64u(bytes)}`;
  const withSign = (bytes: Uint8Array) => {
    const copy = Uint8Array.from(bytes);
    copy[31] = (copy[31] as number) | 0x80;
    return copy;
  };
  /** Deterministic 32-byte strings: SHA-256 of a counter. */
  const candidates = function* () {
    for (let i = 0; ; i++) yield Uint8Array.from(createHash("sha256").update(`candidate ${i}`).digest());
  };
  const decodes = (bytes: Uint8Array) => {
    try {
      return ed25519.Point.fromBytes(bytes);
    } catch {
      return null;
    }
  };
  /** What parsePublicKey refused before the byte checks: anything noble will not decode, or of small order. */
  const referenceAccepts = (bytes: Uint8Array) => {
    const point = decodes(bytes);
    return point !== null && !point.isSmallOrder();
  };
  const offCurve = (count: number) => {
    const found: Uint8Array[] = [];
    for (const bytes of candidates()) {
      bytes[31] = (bytes[31] as number) & 0x7f;
      if (decodes(bytes) === null) found.push(bytes);
      if (found.length === count) return found;
    }
    return found;
  };

  test("the small-order list is exactly the encodings of the eight torsion points, recomputed on the curve", () => {
    const L = ed25519.Point.Fn.ORDER;
    for (const bytes of candidates()) {
      const point = decodes(bytes);
      if (!point) continue;
      // P·L keeps only the torsion component of P; a generator of all eight needs order 8.
      const torsion = point.multiplyUnsafe(L - 1n).add(point);
      const multiples = [torsion];
      for (let i = 1; i < 8; i++) multiples.push((multiples[i - 1] as typeof torsion).add(torsion));
      if (multiples.filter((m) => m.equals(ed25519.Point.ZERO)).length !== 1) continue;
      const masked = new Set(
        multiples.map((m) => {
          const encoded = m.toBytes();
          encoded[31] = (encoded[31] as number) & 0x7f;
          return hex(encoded);
        }),
      );
      expect([...masked].sort()).toEqual(ED25519_SMALL_ORDER_Y.map(hex).sort());
      return;
    }
  });

  test("every small-order encoding is refused: as encoded, with the sign bit flipped, and with y + p", () => {
    const refused: Uint8Array[] = [];
    for (const y of ED25519_SMALL_ORDER_Y) {
      refused.push(y, withSign(y));
      const value = BigInt(`0x${hex(Uint8Array.from(y).reverse())}`);
      if (value + P < 1n << 255n) refused.push(le(value + P), withSign(le(value + P)));
    }
    expect(refused.length).toBe(14);
    for (const bytes of refused) {
      expect(parsePublicKey(text(bytes))).toBeNull();
      expect(parsePublicKey(text(bytes), { signatureFollows: true })).toBeNull();
    }
  });

  test("every non-canonical y (p to 2^255 - 1, either sign) is refused, even where y - p is a proper point", () => {
    let proper = 0;
    for (let value = P; value < 1n << 255n; value++) {
      for (const bytes of [le(value), withSign(le(value))]) {
        if (referenceAccepts(le(value - P))) proper++;
        expect(parsePublicKey(text(bytes))).toBeNull();
        expect(parsePublicKey(text(bytes), { signatureFollows: true })).toBeNull();
      }
    }
    expect(proper).toBeGreaterThan(0);
  });

  test("the RFC 8032 test-vector keys are accepted and verify their signatures", () => {
    const vectors = [
      // TEST 1, TEST 2, TEST 3 of RFC 8032 section 7.1: public key, message, signature.
      [
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
      ],
      [
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
      ],
      [
        "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
        "af82",
        "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
      ],
    ] as const;
    for (const [publicKey, message, signature] of vectors) {
      const bytes = Buffer.from(publicKey, "hex");
      for (const options of [{}, { signatureFollows: true }]) {
        const info = parsePublicKey(text(bytes), options);
        expect(info?.alg).toBe("ed25519");
        const sig = b64u(Buffer.from(signature, "hex"));
        expect(verifySignature(info as PublicKeyInfo, Buffer.from(message, "hex"), sig)).toBe(true);
      }
    }
  });

  test("acceptance is exactly the full decode's, or with signatureFollows that plus off-curve points, on thousands of random encodings", () => {
    let accepted = 0;
    let count = 0;
    for (const bytes of candidates()) {
      const expected = referenceAccepts(bytes);
      if (expected) accepted++;
      expect(parsePublicKey(text(bytes)) !== null).toBe(expected);
      const offTheCurve = decodes(bytes) === null;
      expect(parsePublicKey(text(bytes), { signatureFollows: true }) !== null).toBe(expected || offTheCurve);
      if (++count === 3000) break;
    }
    // About half of all y are on the curve: both outcomes were exercised.
    expect(accepted).toBeGreaterThan(1000);
    expect(accepted).toBeLessThan(2000);
  });

  test("a key off the curve passes the byte checks but no signature ever verifies for it", () => {
    const { privateKey } = generateKeyPairSync("ed25519");
    const message = Buffer.from("Service-Activation-Proof-v1\n{}");
    const identityR = new Uint8Array(32);
    identityR[0] = 1;
    for (const bytes of offCurve(50)) {
      expect(parsePublicKey(text(bytes))).toBeNull();
      const info = parsePublicKey(text(bytes), { signatureFollows: true });
      expect(info?.alg).toBe("ed25519");
      expect(isOnCurve(info as PublicKeyInfo)).toBe(false);
      const signatures = [
        new Uint8Array(64),
        Uint8Array.from([...identityR, ...new Uint8Array(32)]),
        Uint8Array.from([...bytes, ...new Uint8Array(32)]),
        sign(null, message, privateKey),
      ];
      for (const signature of signatures) {
        expect(verifySignature(info as PublicKeyInfo, message, b64u(signature))).toBe(false);
      }
    }
  });

  test("isOnCurve holds for proper Ed25519 and P-256 keys", () => {
    for (const type of ["ed25519", "ec"] as const) {
      const { publicKey } =
        type === "ed25519"
          ? generateKeyPairSync("ed25519")
          : generateKeyPairSync("ec", { namedCurve: "P-256" });
      expect(isOnCurve(parsePublicKey(publicKeyText(publicKey)) as PublicKeyInfo)).toBe(true);
    }
  });
});

describe("signatures and keys are accepted in their one canonical base64url spelling", () => {
  const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  /** Every other text that a lenient decoder reads as the same bytes: the last character's spare bits set. */
  const respellings = (text: string, spareBits: number): string[] => {
    const last = ALPHABET.indexOf(text.at(-1) as string);
    return Array.from({ length: (1 << spareBits) - 1 }, (_, i) => {
      const variant = text.slice(0, -1) + ALPHABET[last | (i + 1)];
      // The premise: Buffer's decoder gives the same bytes, so only the spelling differs.
      expect(Buffer.from(variant, "base64url").equals(Buffer.from(text, "base64url"))).toBe(true);
      return variant;
    });
  };

  test.each([
    ["an Ed25519", "ed25519"],
    ["a P-256", "p256"],
  ] as const)(
    "%s signature verifies as made, and none of its 15 other spellings, padded or with a stray character does",
    (_, alg) => {
      const pair =
        alg === "ed25519"
          ? generateKeyPairSync("ed25519")
          : generateKeyPairSync("ec", { namedCurve: "P-256" });
      const info = parsePublicKey(publicKeyText(pair.publicKey)) as PublicKeyInfo;
      const message = Buffer.from("Service-Device-Proof-v1\nmessage");
      const raw =
        alg === "ed25519"
          ? sign(null, message, pair.privateKey)
          : sign("sha256", message, { key: pair.privateKey, dsaEncoding: "ieee-p1363" });
      const signature = b64u(raw);
      expect(verifySignature(info, message, signature)).toBe(true);
      const variants = respellings(signature, 4);
      expect(variants).toHaveLength(15);
      for (const variant of variants) expect(verifySignature(info, message, variant)).toBe(false);
      expect(verifySignature(info, message, `${signature}==`)).toBe(false);
      expect(verifySignature(info, message, `${signature.slice(0, 40)}.${signature.slice(40)}`)).toBe(false);
    },
  );

  test("a key string in any spelling but the canonical one is refused", () => {
    for (const pair of [generateKeyPairSync("ed25519"), generateKeyPairSync("ec", { namedCurve: "P-256" })]) {
      const text = publicKeyText(pair.publicKey);
      expect(parsePublicKey(text)?.text).toBe(text);
      for (const variant of respellings(text, 2)) expect(parsePublicKey(variant)).toBeNull();
      expect(parsePublicKey(`${text.slice(0, 20)} ${text.slice(20)}`)).toBeNull();
    }
  });
});
