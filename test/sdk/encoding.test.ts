import { describe, expect, test } from "bun:test";
import { b64uDecode, b64uEncode, hex, sha256Hex } from "../../src/sdk/index.ts";

describe("base64url and hex", () => {
  test("encoding matches Node's base64url for every length from 0 to 40 bytes", () => {
    for (let n = 0; n <= 40; n++) {
      const bytes = Uint8Array.from({ length: n }, (_, i) => (i * 37 + n * 11) & 0xff);
      const expected = Buffer.from(bytes).toString("base64url");
      expect(b64uEncode(bytes)).toBe(expected);
      expect([...b64uDecode(expected)]).toEqual([...bytes]);
    }
  });

  test("decoding refuses padding, the standard alphabet, whitespace and impossible lengths", () => {
    for (const bad of ["AA==", "A+/B", "AB C", "A", "AAAAA", "ä"]) {
      expect(() => b64uDecode(bad)).toThrow();
    }
  });

  test("decoding refuses non-zero unused bits so every byte string has one encoding", () => {
    expect([...b64uDecode("AA")]).toEqual([0]);
    expect(() => b64uDecode("AB")).toThrow();
    expect(() => b64uDecode("AAB")).toThrow();
  });

  test("hex is lowercase and SHA-256 matches the FIPS 180-2 vectors", () => {
    expect(hex(new Uint8Array([0, 15, 171, 255]))).toBe("000fabff");
    expect(sha256Hex("")).toBe("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect(sha256Hex("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  });

  test("strings are hashed as UTF-8", () => {
    expect(sha256Hex("€")).toBe(sha256Hex(new Uint8Array([0xe2, 0x82, 0xac])));
  });
});
