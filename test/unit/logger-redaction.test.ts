import { describe, expect, test } from "bun:test";
import { canonicalLicenseKey, generateLicenseKey } from "../../src/domain/license-key.ts";
import { redactPath } from "../../src/http/logger.ts";
import { seededRandom } from "../bench/lib/stats.ts";

/** The implementation before the fast paths, kept as the reference the new one must equal. */
function referenceRedactPath(path: string): string {
  return path
    .split("/")
    .map((segment) => {
      let decoded = segment;
      try {
        decoded = decodeURIComponent(segment);
      } catch {
        // judged as sent
      }
      if (/lsk_[A-Za-z0-9_]*/.test(decoded)) return "[redacted-api-key]";
      if (canonicalLicenseKey(decoded) !== null) return "[redacted-license-key]";
      return segment;
    })
    .join("/");
}

const random = seededRandom(7);
const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)] as T;

/** Every way canonicalLicenseKey folds a character back to the key character `c`. */
const SPELLINGS: Record<string, string[]> = {
  "0": ["0", "O", "o"],
  "1": ["1", "I", "i", "L", "l", "\u0131"], // U+0131 dotless i upper-cases to I
  S: ["S", "s", "\u017f"], // U+017F long s upper-cases to S
};
const spellingsOf = (c: string) => SPELLINGS[c] ?? [c, c.toLowerCase()];
const SEPARATORS = ["", "", "", "-", "--", " ", "\t", "\n", "\u00a0", "\u2003", "\u3000", "\ufeff", "\u2028"];

/** A spelling of `key` a client might send: any case, aliases, separators anywhere, maybe percent-encoded. */
function variantOf(key: string): string {
  let text = pick(SEPARATORS);
  for (const c of key.replace(/-/g, "")) text += pick(spellingsOf(c)) + pick(SEPARATORS);
  const encoding = random();
  if (encoding < 0.3) return encodeURIComponent(text);
  if (encoding < 0.5) return [...text].map((c) => (random() < 0.3 ? encodeURIComponent(c) : c)).join("");
  // Every byte encoded, letters and digits too.
  if (encoding < 0.6)
    return [...Buffer.from(text)].map((b) => `%${b.toString(16).padStart(2, "0")}`).join("");
  return text.replace(/[\s/%]/gu, (c) => encodeURIComponent(c));
}

describe("request paths in the log", () => {
  test("a path with nothing to hide is logged as it came", () => {
    for (const path of [
      "/runtime/v1/activations/act_01JZ8X5A7C9E1G3H5J7K9M1N3P/heartbeat",
      "/mgmt/v1/licenses?limit=10",
      "/",
      "",
      "//double//slashes//",
    ]) {
      expect(redactPath(path)).toBe(path);
    }
  });

  test("an API key or a license key in a segment, plain or percent-encoded, is replaced", () => {
    const key = generateLicenseKey();
    expect(redactPath(`/mgmt/v1/licenses/${key}`)).toBe("/mgmt/v1/licenses/[redacted-license-key]");
    expect(redactPath(`/x/${encodeURIComponent(key.toLowerCase())}/y/`)).toBe("/x/[redacted-license-key]/y/");
    expect(redactPath("/mgmt/v1/lsk_live_abc/products")).toBe("/mgmt/v1/[redacted-api-key]/products");
    expect(redactPath("/mgmt/v1/%6Csk_live_abc")).toBe("/mgmt/v1/[redacted-api-key]");
    expect(redactPath(`/a/lsk_1/${key}`)).toBe("/a/[redacted-api-key]/[redacted-license-key]");
  });

  test("every spelling of real keys canonicalLicenseKey accepts is redacted (thousands of variants)", () => {
    let accepted = 0;
    for (let i = 0; i < 5000; i++) {
      const variant = variantOf(generateLicenseKey());
      const decoded = decodeURIComponent(variant);
      if (canonicalLicenseKey(decoded) === null) continue;
      accepted++;
      expect(redactPath(`/runtime/v1/${variant}/x`)).toBe("/runtime/v1/[redacted-license-key]/x");
    }
    // Most variants stay within the 64 characters a key may be sent in.
    expect(accepted).toBeGreaterThan(2500);
  });

  test("any one UTF-16 code unit added to or swapped into a key is judged as canonicalLicenseKey judges it", () => {
    const key = generateLicenseKey().replace(/-/g, "");
    for (let unit = 0; unit <= 0xffff; unit++) {
      const c = String.fromCharCode(unit);
      for (const text of [key.slice(0, 12) + c + key.slice(12), key.slice(0, 12) + c + key.slice(13)]) {
        const expected = canonicalLicenseKey(text) !== null ? "[redacted-license-key]" : text;
        // Lone surrogates cannot be percent-encoded: sent as they are.
        if (unit >= 0xd800 && unit <= 0xdfff) {
          expect(redactPath(text)).toBe(expected);
          continue;
        }
        const segment = encodeURIComponent(text);
        expect(redactPath(segment)).toBe(expected === text ? segment : expected);
      }
    }
  });

  test("the result equals the reference implementation on thousands of random paths", () => {
    const ids = ["act_01JZ8X5A7C9E1G3H5J7K9M1N3P", "lic_01JZ8X4N0A1B2C3D4E5F6G7H8J", "heartbeat", "v1", ""];
    const odd = [
      "%",
      "%E0%A4%A",
      "%zz",
      "lsk_",
      "LSK_x",
      "%6c%73%6b%5f",
      "a%2Fb",
      "\u00e9t\u00e9",
      "0".repeat(70),
    ];
    const segment = () => {
      const kind = random();
      if (kind < 0.3) return pick(ids);
      if (kind < 0.5) return pick(odd);
      if (kind < 0.8) return variantOf(generateLicenseKey());
      // A key with one character broken: usually not a key any more.
      const v = variantOf(generateLicenseKey());
      const at = Math.floor(random() * v.length);
      return v.slice(0, at) + pick(["_", "U", "u", ".", "!", "%", "~", "*"]) + v.slice(at + 1);
    };
    let redacted = 0;
    for (let i = 0; i < 5000; i++) {
      const path = Array.from({ length: 1 + Math.floor(random() * 5) }, segment).join("/");
      const expected = referenceRedactPath(path);
      if (expected !== path) redacted++;
      expect(redactPath(path)).toBe(expected);
    }
    expect(redacted).toBeGreaterThan(1000);
  });
});
