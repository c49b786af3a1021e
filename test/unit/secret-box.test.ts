import { describe, expect, test } from "bun:test";
import { SecretBox } from "../../src/crypto/secret-box.ts";

const key = (fill?: number) =>
  fill === undefined ? crypto.getRandomValues(new Uint8Array(32)) : new Uint8Array(32).fill(fill);

const flipByte = (sealed: string, index: number): string => {
  const body = Buffer.from(sealed.slice(3), "base64url");
  const at = index < 0 ? body.length + index : index;
  body[at] = (body[at] ?? 0) ^ 0x01;
  return `v1.${body.toString("base64url")}`;
};

describe("encrypt and decrypt", () => {
  const box = new SecretBox(key(7));

  test("a value encrypted under a context decrypts to the same value under that context", () => {
    for (const value of ["7K2QX-M4ZRT-9HB3N-WPD6F-1VAYC", "", "ünïcødé € 😀", "x".repeat(10_000)]) {
      const sealed = box.encrypt(value, "licenses:lic_01");
      expect(box.decrypt(sealed, "licenses:lic_01")).toBe(value);
    }
  });

  test("the sealed form is versioned and does not contain the plaintext", () => {
    const sealed = box.encrypt("super-secret-value", "ctx");
    expect(sealed.startsWith("v1.")).toBe(true);
    expect(sealed).not.toContain("super-secret-value");
    expect(Buffer.from(sealed.slice(3), "base64url").toString("latin1")).not.toContain("super-secret-value");
  });

  test("the context binds the ciphertext: decrypting under another context throws", () => {
    const sealed = box.encrypt("secret", "licenses:lic_A");
    expect(() => box.decrypt(sealed, "licenses:lic_B")).toThrow();
    expect(() => box.decrypt(sealed, "")).toThrow();
    expect(() => box.decrypt(sealed, "licenses:lic_A ")).toThrow();
  });

  test("flipping any single byte of the nonce, ciphertext or tag makes decryption throw", () => {
    const sealed = box.encrypt("secret value", "ctx");
    const length = Buffer.from(sealed.slice(3), "base64url").length;
    expect(length).toBe(12 + "secret value".length + 16);
    for (let i = 0; i < length; i++) {
      expect(() => box.decrypt(flipByte(sealed, i), "ctx")).toThrow();
    }
  });

  test("a truncated value throws instead of decrypting", () => {
    const sealed = box.encrypt("secret value", "ctx");
    const body = Buffer.from(sealed.slice(3), "base64url");
    expect(() =>
      box.decrypt(`v1.${body.subarray(0, body.length - 1).toString("base64url")}`, "ctx"),
    ).toThrow();
    expect(() => box.decrypt("v1.", "ctx")).toThrow();
  });

  test("a value with an unknown version prefix is refused", () => {
    const sealed = box.encrypt("secret", "ctx");
    expect(() => box.decrypt(`v2.${sealed.slice(3)}`, "ctx")).toThrow();
    expect(() => box.decrypt(sealed.slice(3), "ctx")).toThrow();
  });

  test("two encryptions of one value under one context differ", () => {
    const a = box.encrypt("same", "ctx");
    const b = box.encrypt("same", "ctx");
    expect(a).not.toBe(b);
    expect(Buffer.from(a.slice(3), "base64url").subarray(0, 12)).not.toEqual(
      Buffer.from(b.slice(3), "base64url").subarray(0, 12),
    );
    expect(box.decrypt(a, "ctx")).toBe("same");
    expect(box.decrypt(b, "ctx")).toBe("same");
  });

  test("a box with another data key cannot decrypt the value", () => {
    const sealed = box.encrypt("secret", "ctx");
    expect(() => new SecretBox(key(8)).decrypt(sealed, "ctx")).toThrow();
  });

  test("a box rebuilt from the same data key decrypts the value", () => {
    const sealed = box.encrypt("secret", "ctx");
    expect(new SecretBox(key(7)).decrypt(sealed, "ctx")).toBe("secret");
  });
});

describe("lookupHash", () => {
  const dataKey = key();
  const box = new SecretBox(dataKey);

  test("the same value and purpose always give the same hash, also from a rebuilt box", () => {
    const a = box.lookupHash("7K2QXM4ZRT9HB3NWPD6F1VAYC", "license-key");
    expect(box.lookupHash("7K2QXM4ZRT9HB3NWPD6F1VAYC", "license-key")).toBe(a);
    expect(
      new SecretBox(Uint8Array.from(dataKey)).lookupHash("7K2QXM4ZRT9HB3NWPD6F1VAYC", "license-key"),
    ).toBe(a);
  });

  test("the hash is 64 lower-case hex characters", () => {
    expect(box.lookupHash("value", "purpose")).toMatch(/^[0-9a-f]{64}$/);
  });

  test("the same value under different purposes gives different hashes", () => {
    expect(box.lookupHash("value", "license-key")).not.toBe(box.lookupHash("value", "webhook-secret"));
  });

  test("different values give different hashes", () => {
    expect(box.lookupHash("value-1", "p")).not.toBe(box.lookupHash("value-2", "p"));
  });

  test("the same value under another data key gives a different hash", () => {
    expect(new SecretBox(key()).lookupHash("value", "p")).not.toBe(box.lookupHash("value", "p"));
  });

  test("the hash is keyed: it is not a plain SHA-256 of the value", () => {
    const plain = new Bun.CryptoHasher("sha256").update("p\nvalue").digest("hex");
    const bare = new Bun.CryptoHasher("sha256").update("value").digest("hex");
    const hash = box.lookupHash("value", "p");
    expect(hash).not.toBe(plain);
    expect(hash).not.toBe(bare);
  });

  test("the hash never contains the plaintext", () => {
    // Values of 8+ characters: a random 64-hex string contains a given 8-hex run with chance ~1e-8.
    for (const value of ["deadbeef", "0123456789abcdef", "7K2QXM4ZRT9HB3NWPD6F1VAYC"]) {
      const hash = box.lookupHash(value, "p");
      expect(hash).not.toContain(value);
      expect(hash).not.toContain(value.toLowerCase());
    }
  });
});
