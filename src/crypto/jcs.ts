/**
 * RFC 8785 JSON Canonicalization Scheme. ECMAScript number serialisation and UTF-16 code-unit key
 * order are exactly what JSON.stringify and Array#sort give, so the scheme is a sorted re-serialise.
 *
 * Every signed response and certificate goes through here, so it is written for speed: only the
 * keys are sorted (default sort compares UTF-16 code units, as RFC 8785 §3.2.3 asks), the text is
 * built by concatenation, no entry arrays are allocated, and strings JSON.stringify would write
 * unchanged between quotes (ids, hashes, base64url) are quoted without calling it. test/unit/jcs-equivalence.test.ts
 * compares it with the plain implementation on random values.
 */
export function canonicalize(value: unknown): string {
  switch (typeof value) {
    case "string":
      return quote(value);
    case "boolean":
      return value ? "true" : "false";
    case "number":
      if (!Number.isFinite(value)) throw new TypeError("JCS cannot encode a non-finite number");
      return JSON.stringify(value);
    case "object": {
      if (value === null) return "null";
      if (Array.isArray(value)) {
        let out = "[";
        for (let i = 0; i < value.length; i++) {
          if (i > 0) out += ",";
          out += canonicalize(value[i] ?? null);
        }
        return `${out}]`;
      }
      const record = value as Record<string, unknown>;
      const keys = Object.keys(record).sort();
      let out = "{";
      for (const key of keys) {
        const item = record[key];
        if (item === undefined) continue;
        if (out.length > 1) out += ",";
        out += `${quote(key)}:${canonicalize(item)}`;
      }
      return `${out}}`;
    }
    default:
      throw new TypeError(`JCS cannot encode a value of type ${typeof value}`);
  }
}

/** What JSON.stringify escapes in a string: '"', '\\', U+0000..U+001F, and surrogates (lone ones). */
// biome-ignore lint/suspicious/noControlCharactersInRegex: U+0000-U+001F is exactly what JSON escapes.
const NEEDS_ESCAPE = /["\\\u0000-\u001f\ud800-\udfff]/;

/**
 * JSON.stringify of a string. A string with nothing to escape (ids, hashes, base64url: nearly all
 * of them) is just quoted; the check is one native regex scan, several times faster than a loop.
 */
export function quote(text: string): string {
  return NEEDS_ESCAPE.test(text) ? JSON.stringify(text) : `"${text}"`;
}
