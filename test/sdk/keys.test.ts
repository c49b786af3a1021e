import { describe, expect, test } from "bun:test";
import { createPrivateKey, generateKeyPairSync, sign as nodeSign } from "node:crypto";
import { p256 } from "@noble/curves/nist.js";
import {
  b64uDecode,
  b64uEncode,
  exportDeviceKeys,
  generateDeviceKeys,
  importDeviceKeys,
  keyIdOf,
  keyPairFromSecret,
  parsePublicKey,
  SdkError,
  sign,
  thumbprint,
  verifySignature,
} from "../../src/sdk/index.ts";
import { nodeSha256Hex, nodeVerify } from "./support/node-crypto.ts";

const SEED = Uint8Array.from({ length: 32 }, (_, i) => i);
const P256_SECRET = new Uint8Array(32).fill(0x11);
const utf8 = (s: string) => new TextEncoder().encode(s);
const P256_N = BigInt("0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551");

describe("public keys, thumbprints and key ids", () => {
  test("fixed secrets give the public key strings Node derives for them", () => {
    expect(keyPairFromSecret("ed25519", SEED).publicKey).toBe(
      "ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg",
    );
    expect(keyPairFromSecret("p256", P256_SECRET).publicKey).toBe(
      "p256:BAIX5hfwtkQ5KCePlpmeaaI6TywVK99tbN9m5bgCgtTtGUp968uXcS0t2jyoWqh2Wlb0X8dYWZZS8ol8ZTBuV5Q",
    );
  });

  test("the thumbprint is the SHA-256 of the key string and the key id is k_ plus its first 20 hex", () => {
    const key = "ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg";
    expect(thumbprint(key)).toBe("41188994976c0c5981046e1c418e9fce265d98ce1f2a9c612eba71f16980e809");
    expect(thumbprint(key)).toBe(nodeSha256Hex(key));
    expect(keyIdOf(key)).toBe("k_41188994976c0c598104");
  });

  test("malformed key strings are refused", () => {
    const good = keyPairFromSecret("p256", P256_SECRET).publicKey;
    const compressed = `p256:${b64uEncode(p256.getPublicKey(P256_SECRET, true))}`;
    for (const bad of [
      "",
      "ed25519:",
      "ed25519:AAAA",
      "rsa:AAAA",
      compressed,
      good.replace("p256", "ed25519"),
    ]) {
      expect(() => parsePublicKey(bad)).toThrow();
    }
    expect(parsePublicKey(good).alg).toBe("p256");
  });
});

describe("signatures", () => {
  test("Ed25519 signatures verify with Node and Node's signatures verify with the SDK", () => {
    const pair = keyPairFromSecret("ed25519", SEED);
    const sig = sign(pair, utf8("hello"));
    expect(b64uDecode(sig).length).toBe(64);
    expect(nodeVerify(pair.publicKey, "hello", sig)).toBe(true);
    const { privateKey, publicKey } = generateKeyPairSync("ed25519");
    const nodeSig = nodeSign(null, Buffer.from("hi"), privateKey).toString("base64url");
    const jwk = publicKey.export({ format: "jwk" });
    expect(verifySignature(`ed25519:${jwk.x}`, utf8("hi"), nodeSig)).toBe(true);
    expect(verifySignature(`ed25519:${jwk.x}`, utf8("ho"), nodeSig)).toBe(false);
  });

  test("P-256 signatures are 64-byte low-S r||s over SHA-256 that Node verifies", () => {
    const pair = keyPairFromSecret("p256", P256_SECRET);
    for (let i = 0; i < 20; i++) {
      const sig = sign(pair, utf8(`message ${i}`));
      const raw = b64uDecode(sig);
      expect(raw.length).toBe(64);
      const s = BigInt(`0x${Buffer.from(raw.subarray(32)).toString("hex")}`);
      expect(s <= P256_N / 2n).toBe(true);
      expect(nodeVerify(pair.publicKey, `message ${i}`, sig)).toBe(true);
    }
  });

  test("P-256 verification accepts both the low-S and the high-S form of a signature", () => {
    const pair = keyPairFromSecret("p256", P256_SECRET);
    const raw = b64uDecode(sign(pair, utf8("m")));
    const r = raw.subarray(0, 32);
    const s = BigInt(`0x${Buffer.from(raw.subarray(32)).toString("hex")}`);
    const high = Buffer.from((P256_N - s).toString(16).padStart(64, "0"), "hex");
    const highSig = b64uEncode(new Uint8Array([...r, ...high]));
    expect(verifySignature(pair.publicKey, utf8("m"), b64uEncode(raw))).toBe(true);
    expect(verifySignature(pair.publicKey, utf8("m"), highSig)).toBe(true);
    expect(nodeVerify(pair.publicKey, "m", highSig)).toBe(true);
  });

  test("P-256 signatures made by Node verify with the SDK", () => {
    const { privateKey, publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
    const jwk = publicKey.export({ format: "jwk" });
    const point = new Uint8Array([
      4,
      ...Buffer.from(jwk.x!, "base64url"),
      ...Buffer.from(jwk.y!, "base64url"),
    ]);
    const key = `p256:${b64uEncode(point)}`;
    const sig = nodeSign("sha256", Buffer.from("x"), { key: privateKey, dsaEncoding: "ieee-p1363" });
    expect(verifySignature(key, utf8("x"), sig.toString("base64url"))).toBe(true);
  });

  test("truncated, extended, re-encoded and forged signatures are refused", () => {
    for (const alg of ["ed25519", "p256"] as const) {
      const pair = keyPairFromSecret(alg, alg === "ed25519" ? SEED : P256_SECRET);
      const sig = sign(pair, utf8("m"));
      const raw = b64uDecode(sig);
      const flipped = raw.slice();
      flipped[10] = flipped[10]! ^ 1;
      expect(verifySignature(pair.publicKey, utf8("m"), b64uEncode(raw.subarray(0, 63)))).toBe(false);
      expect(verifySignature(pair.publicKey, utf8("m"), b64uEncode(new Uint8Array([...raw, 0])))).toBe(false);
      expect(verifySignature(pair.publicKey, utf8("m"), Buffer.from(raw).toString("base64"))).toBe(false);
      expect(verifySignature(pair.publicKey, utf8("m"), `${sig}==`)).toBe(false);
      expect(verifySignature(pair.publicKey, utf8("m"), b64uEncode(flipped))).toBe(false);
      expect(verifySignature(pair.publicKey, utf8("m"), b64uEncode(new Uint8Array(64)))).toBe(false);
      expect(verifySignature(pair.publicKey, utf8("n"), sig)).toBe(false);
      expect(verifySignature(pair.publicKey, utf8("m"), 42)).toBe(false);
    }
  });
});

describe("device keys", () => {
  for (const alg of ["ed25519", "p256"] as const) {
    test(`${alg} device keys survive export and import and keep a separate P-256 KEM key`, () => {
      const keys = generateDeviceKeys(alg);
      expect(keys.signing.alg).toBe(alg);
      expect(keys.kem.alg).toBe("p256");
      expect(keys.kem.publicKey).not.toBe(keys.signing.publicKey);
      const json = exportDeviceKeys(keys);
      const back = importDeviceKeys(json);
      expect(back.signing.publicKey).toBe(keys.signing.publicKey);
      expect(back.kem.publicKey).toBe(keys.kem.publicKey);
      expect(nodeVerify(back.signing.publicKey, "z", sign(back.signing, utf8("z")))).toBe(true);
      const parsed = JSON.parse(json);
      expect(parsed.signing.private_key).toMatch(/^[A-Za-z0-9_-]{43}$/);
    });
  }

  test("importing keys whose public key does not match the private key fails with STORAGE_CORRUPT", () => {
    const a = JSON.parse(exportDeviceKeys(generateDeviceKeys()));
    a.signing.public_key = generateDeviceKeys().signing.publicKey;
    let error: unknown;
    try {
      importDeviceKeys(JSON.stringify(a));
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(SdkError);
    expect((error as SdkError).code).toBe("STORAGE_CORRUPT");
    expect(() => importDeviceKeys("{}")).toThrow(SdkError);
    expect(() => importDeviceKeys("not json")).toThrow(SdkError);
  });

  test("an Ed25519 secret gives the same public key as Node's PKCS#8 import of the same seed", () => {
    const der = Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), Buffer.from(SEED)]);
    const jwk = createPrivateKey({ key: der, format: "der", type: "pkcs8" }).export({ format: "jwk" });
    expect(keyPairFromSecret("ed25519", SEED).publicKey).toBe(`ed25519:${jwk.x}`);
  });
});
