/**
 * JSON Canonicalization Scheme, RFC 8785.
 *
 * - Numbers use the ECMAScript Number-to-String algorithm (RFC 8785 §3.2.2.3), which is what
 *   `String(n)` implements; NaN and ±Infinity are refused; -0 becomes "0".
 * - Strings escape only `"`, `\` and U+0000..U+001F (short forms \b \t \n \f \r, else \u00xx in
 *   lowercase hex); everything else is written as is. Lone surrogates are refused (I-JSON).
 * - Object members are sorted by their names as arrays of UTF-16 code units (§3.2.3).
 * - Object members whose value is `undefined` are left out, as JSON.stringify does, so that
 *   JCS(x) === JCS(JSON.parse(JSON.stringify(x))). `undefined` elsewhere, functions, symbols and
 *   bigints are refused.
 */

export type JsonPrimitive = string | number | boolean | null;
export type JsonValue = JsonPrimitive | JsonValue[] | { [key: string]: JsonValue };
export type JsonObject = { [key: string]: JsonValue };

export class CanonicalizationError extends Error {
  override name = "CanonicalizationError";
}

export function canonicalize(value: unknown): string {
  const parts: string[] = [];
  write(value, parts, 0);
  return parts.join("");
}

const MAX_DEPTH = 64;

function write(value: unknown, out: string[], depth: number): void {
  if (depth > MAX_DEPTH) throw new CanonicalizationError("value nested too deeply");
  if (value === null) {
    out.push("null");
    return;
  }
  switch (typeof value) {
    case "boolean":
      out.push(value ? "true" : "false");
      return;
    case "number":
      out.push(serializeNumber(value));
      return;
    case "string":
      out.push(serializeString(value));
      return;
    case "object":
      break;
    default:
      throw new CanonicalizationError(`cannot canonicalize a value of type ${typeof value}`);
  }
  if (Array.isArray(value)) {
    out.push("[");
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out.push(",");
      const item: unknown = value[i];
      if (item === undefined) throw new CanonicalizationError("undefined inside an array");
      write(item, out, depth + 1);
    }
    out.push("]");
    return;
  }
  const proto = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) {
    throw new CanonicalizationError("only plain objects can be canonicalized");
  }
  const record = value as Record<string, unknown>;
  const keys = Object.keys(record)
    .filter((k) => record[k] !== undefined)
    .sort(compareUtf16);
  out.push("{");
  keys.forEach((key, i) => {
    if (i > 0) out.push(",");
    out.push(serializeString(key), ":");
    write(record[key], out, depth + 1);
  });
  out.push("}");
}

/** Orders strings by UTF-16 code units, as RFC 8785 §3.2.3 requires. */
export function compareUtf16(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const d = a.charCodeAt(i) - b.charCodeAt(i);
    if (d !== 0) return d;
  }
  return a.length - b.length;
}

export function serializeNumber(n: number): string {
  if (!Number.isFinite(n)) throw new CanonicalizationError("NaN and Infinity are not JSON");
  if (Object.is(n, -0)) return "0";
  return String(n);
}

const SHORT_ESCAPES: Record<number, string> = {
  8: "\\b",
  9: "\\t",
  10: "\\n",
  12: "\\f",
  13: "\\r",
  34: '\\"',
  92: "\\\\",
};

export function serializeString(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const short = SHORT_ESCAPES[c];
    if (short !== undefined) {
      out += short;
    } else if (c < 0x20) {
      out += `\\u${c.toString(16).padStart(4, "0")}`;
    } else if (c >= 0xd800 && c <= 0xdbff) {
      const next = s.charCodeAt(i + 1);
      if (!(next >= 0xdc00 && next <= 0xdfff)) throw new CanonicalizationError("lone surrogate in string");
      out += s.charAt(i) + s.charAt(i + 1);
      i++;
    } else if (c >= 0xdc00 && c <= 0xdfff) {
      throw new CanonicalizationError("lone surrogate in string");
    } else {
      out += s.charAt(i);
    }
  }
  return `${out}"`;
}
