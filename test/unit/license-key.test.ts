import { describe, expect, test } from "bun:test";
import { CROCKFORD_ALPHABET } from "../../src/domain/base32.ts";
import { canonicalLicenseKey, formatLicenseKey, generateLicenseKey } from "../../src/domain/license-key.ts";

const DISPLAY_FORMAT = /^[0-9A-HJKMNP-TV-Z]{5}(-[0-9A-HJKMNP-TV-Z]{5}){4}$/;
const SAMPLE = "7K2QX-M4ZRT-9HB3N-WPD6F-1VAYC";
const SAMPLE_CANONICAL = "7K2QXM4ZRT9HB3NWPD6F1VAYC";

describe("generated keys", () => {
  test("a generated key is five dash-separated groups of five Crockford characters", () => {
    for (let i = 0; i < 100; i++) expect(generateLicenseKey()).toMatch(DISPLAY_FORMAT);
  });

  test("a key carries at least 120 bits: 25 characters of a 32-symbol alphabet", () => {
    const key = generateLicenseKey();
    const canonical = canonicalLicenseKey(key);
    expect(canonical).toHaveLength(25);
    expect(CROCKFORD_ALPHABET).toHaveLength(32);
    expect(new Set(CROCKFORD_ALPHABET).size).toBe(32);
    expect(25 * Math.log2(CROCKFORD_ALPHABET.length)).toBeGreaterThanOrEqual(120);
  });

  test("a generated key is already canonical once its dashes are removed", () => {
    const key = generateLicenseKey();
    expect(canonicalLicenseKey(key)).toBe(key.replaceAll("-", ""));
    expect(formatLicenseKey(key.replaceAll("-", ""))).toBe(key);
  });

  test("ten thousand generated keys are unique and use every symbol at every position", () => {
    const keys = new Set<string>();
    const seen: Set<string>[] = Array.from({ length: 25 }, () => new Set<string>());
    const counts: number[][] = Array.from({ length: 25 }, () => new Array(32).fill(0));
    for (let i = 0; i < 10_000; i++) {
      const canonical = canonicalLicenseKey(generateLicenseKey());
      expect(canonical).not.toBeNull();
      keys.add(canonical as string);
      for (let p = 0; p < 25; p++) {
        const char = (canonical as string)[p] as string;
        seen[p]?.add(char);
        const row = counts[p] as number[];
        const index = CROCKFORD_ALPHABET.indexOf(char);
        row[index] = (row[index] ?? 0) + 1;
      }
    }
    expect(keys.size).toBe(10_000);
    for (let p = 0; p < 25; p++) {
      expect(seen[p]?.size).toBe(32);
      // Expected 312.5 per symbol; a uniform generator stays far inside 150..500 (>9 sigma).
      for (const count of counts[p] as number[]) {
        expect(count).toBeGreaterThan(150);
        expect(count).toBeLessThan(500);
      }
    }
  });
});

describe("canonicalLicenseKey", () => {
  test("accepts the display form and removes its dashes", () => {
    expect(canonicalLicenseKey(SAMPLE)).toBe(SAMPLE_CANONICAL);
  });

  test("accepts lower case", () => {
    expect(canonicalLicenseKey(SAMPLE.toLowerCase())).toBe(SAMPLE_CANONICAL);
  });

  test("accepts a key typed without dashes", () => {
    expect(canonicalLicenseKey(SAMPLE_CANONICAL)).toBe(SAMPLE_CANONICAL);
  });

  test("accepts spaces instead of dashes, and stray surrounding whitespace", () => {
    expect(canonicalLicenseKey(SAMPLE.replaceAll("-", " "))).toBe(SAMPLE_CANONICAL);
    expect(canonicalLicenseKey(`  ${SAMPLE}\t`)).toBe(SAMPLE_CANONICAL);
  });

  test("maps I and L to 1 and O to 0, in either case", () => {
    expect(canonicalLicenseKey("IIIII-LLLLL-OOOOO-iiiii-lo0l1")).toBe("1111111111000001111110011");
  });

  test("rejects a key that is one character short or one character long", () => {
    expect(canonicalLicenseKey(SAMPLE.slice(0, -1))).toBeNull();
    expect(canonicalLicenseKey(`${SAMPLE}A`)).toBeNull();
    expect(canonicalLicenseKey("")).toBeNull();
  });

  test("rejects U, which Crockford base32 does not use", () => {
    expect(canonicalLicenseKey(`U${SAMPLE.slice(1)}`)).toBeNull();
    expect(canonicalLicenseKey(`u${SAMPLE.slice(1)}`)).toBeNull();
  });

  test("rejects punctuation other than dashes", () => {
    for (const mark of [".", "_", "/", "+", "=", "*"]) {
      expect(canonicalLicenseKey(SAMPLE.replace("-", mark))).toBeNull();
    }
  });

  test("rejects over-long input even when it is only separators around a valid key", () => {
    expect(canonicalLicenseKey(`${"-".repeat(40)}${SAMPLE}`)).toBeNull();
    expect(canonicalLicenseKey("A".repeat(10_000))).toBeNull();
  });
});

describe("formatLicenseKey", () => {
  test("groups a canonical key into five groups of five", () => {
    expect(formatLicenseKey(SAMPLE_CANONICAL)).toBe(SAMPLE);
  });
});
