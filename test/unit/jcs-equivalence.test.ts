import { describe, expect, test } from "bun:test";
import { assertionJcs, type ResponseAssertion } from "../../src/crypto/envelope.ts";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { seededRandom } from "../bench/lib/stats.ts";

/** The plain implementation canonicalize replaced (entries, filter, sort, map, join): the reference. */
function reference(value: unknown): string {
  if (value === null || typeof value === "boolean" || typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new TypeError("JCS cannot encode a non-finite number");
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map((item) => reference(item ?? null)).join(",")}]`;
  if (typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${reference(v)}`).join(",")}}`;
  }
  throw new TypeError(`JCS cannot encode a value of type ${typeof value}`);
}

const outcome = (encode: (value: unknown) => string, value: unknown) => {
  try {
    return { text: encode(value) };
  } catch (error) {
    return { error: `${(error as Error).name}: ${(error as Error).message}` };
  }
};

const random = seededRandom(8785);
const int = (n: number) => Math.floor(random() * n);
const pick = <T>(items: readonly T[]): T => items[int(items.length)] as T;

const CHARS = [
  "a",
  "Z",
  "0",
  " ",
  '"',
  "\\",
  "/",
  "\b",
  "\f",
  "\n",
  "\r",
  "\t",
  "\u0000",
  "\u001f",
  "\u007f",
  "\u0080",
  "\u00e9",
  "\u2028",
  "\u2029",
  "\u20ac",
  "\ufb33",
  "\uff61",
  "\ufeff",
  "\uffff",
  "\ud83d\ude00",
  "\u{10000}",
  "\ud800",
  "\udfff",
  "\ud83d",
  "_",
  "-",
  "1",
  "é",
] as const;
const randomString = () => {
  if (random() < 0.3)
    return pick(["", "act_01JZ8X5A7C9E1G3H5J7K9M1N3P", "9b50a692f67ab227d425c7049236b9817c53a56a"]);
  let text = "";
  for (let i = int(12); i > 0; i--) text += random() < 0.5 ? String.fromCharCode(32 + int(95)) : pick(CHARS);
  return text;
};
const randomNumber = () => {
  const special = [
    0,
    -0,
    1,
    -1,
    1e21,
    1e20,
    1e-7,
    1e-6,
    5e-324,
    -5e-324,
    2 ** 53,
    -(2 ** 53),
    1.7976931348623157e308,
    0.1,
    333333333.3333333,
    9.999999999999997e22,
  ];
  const kind = random();
  if (kind < 0.3) return pick(special);
  if (kind < 0.5) return int(2 ** 31) - 2 ** 30;
  // Any finite double, from random bits.
  const view = new DataView(new ArrayBuffer(8));
  for (;;) {
    view.setUint32(0, int(2 ** 32));
    view.setUint32(4, int(2 ** 32));
    const n = view.getFloat64(0);
    if (Number.isFinite(n)) return n;
  }
};
const KEYS = [
  "a",
  "b",
  "B",
  "1",
  "10",
  "2",
  "",
  "\u00e9",
  "\u20ac",
  "\ud83d\ude00",
  "\ufb33",
  "\uff61",
  "\u{10000}",
  "\r",
  "key with space",
  "__proto__",
  "constructor",
];
const randomValue = (depth: number): unknown => {
  const kind = random();
  if (depth > 4 || kind < 0.45) {
    return pick([null, true, false, randomString(), randomNumber(), randomNumber(), randomString()]);
  }
  if (kind < 0.7)
    return Array.from({ length: int(5) }, () => (random() < 0.1 ? undefined : randomValue(depth + 1)));
  // Through JSON.parse for some, so "__proto__" can be an own key as it is in a parsed body.
  const object: Record<string, unknown> = JSON.parse("{}");
  for (let i = int(7); i > 0; i--) {
    const key = random() < 0.6 ? pick(KEYS) : randomString();
    Object.defineProperty(object, key, {
      value: random() < 0.1 ? undefined : randomValue(depth + 1),
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return object;
};

describe("canonicalize writes exactly what the plain implementation wrote", () => {
  test("on 20,000 random nested values: unicode, escapes, surrogates, every kind of double, undefined members", () => {
    let objects = 0;
    for (let i = 0; i < 20_000; i++) {
      const value = randomValue(0);
      if (typeof value === "object" && value !== null && !Array.isArray(value)) objects++;
      expect(outcome(canonicalize, value)).toEqual(outcome(reference, value));
    }
    expect(objects).toBeGreaterThan(3000);
  });

  test("every UTF-16 code unit, alone and inside a longer string, as a value and as a key", () => {
    for (let unit = 0; unit <= 0xffff; unit++) {
      const c = String.fromCharCode(unit);
      for (const value of [c, `id_${c}x`, { [c]: c, [`a${c}`]: 1 }, [`${c}${c}`]]) {
        expect(canonicalize(value)).toBe(reference(value));
      }
    }
  });

  test("keys that sort differently by code point than by UTF-16 code unit, and integer-like keys", () => {
    const value = JSON.parse(
      '{"\\uff61":1,"\\ud800\\udc00":2,"10":3,"2":4,"1":5,"":6,"__proto__":7,"b":8,"B":9}',
    );
    expect(canonicalize(value)).toBe(reference(value));
    expect(canonicalize(value)).toBe(
      '{"":6,"1":5,"10":3,"2":4,"B":9,"__proto__":7,"b":8,"\ud800\udc00":2,"\uff61":1}',
    );
  });

  test("what cannot be encoded is refused the same way: non-finite numbers, functions, bigints, symbols, undefined", () => {
    for (const bad of [Number.NaN, Number.POSITIVE_INFINITY, () => 1, 1n, Symbol("s"), undefined]) {
      for (const value of [bad, [bad], { a: { b: bad } }]) {
        const expected = outcome(reference, value);
        expect(outcome(canonicalize, value)).toEqual(expected);
      }
    }
    // An undefined member is dropped, an undefined array item is null: both sides agree above.
    expect(canonicalize([undefined, { a: undefined }])).toBe("[null,{}]");
  });

  test("a hole in a sparse array is null, as JSON.stringify writes it (the plain version wrote invalid JSON)", () => {
    // Holes never come from JSON.parse or from our own values; a test can make one.
    const sparse: unknown[] = [1];
    sparse[2] = 3;
    expect(reference(sparse)).toBe("[1,,3]");
    expect(canonicalize(sparse)).toBe("[1,null,3]");
    expect(canonicalize(sparse)).toBe(JSON.stringify(sparse));
  });
});

describe("the response assertion's hand-written JCS text", () => {
  test("equals the plain implementation's on 5,000 assertions of random strings and numbers", () => {
    for (let i = 0; i < 5_000; i++) {
      const assertion: ResponseAssertion = {
        v: 1,
        product_id: randomString(),
        key_id: randomString(),
        parent_key_id: randomString(),
        request_id: randomString(),
        nonce: randomString(),
        server_time: i % 2 === 0 ? int(2 ** 32) : randomNumber(),
        status: random() < 0.5 ? pick([200, 201, 202, 403, 410]) : randomNumber(),
        body_sha256: randomString(),
      };
      expect(outcome(assertionJcs as (value: unknown) => string, assertion)).toEqual(
        outcome(reference, assertion),
      );
    }
  });
});
