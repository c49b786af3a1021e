import { describe, expect, test } from "bun:test";
import { canonicalize } from "../../src/crypto/jcs.ts";

describe("RFC 8785 examples", () => {
  test("the sorting example of section 3.2.3 orders keys by UTF-16 code units", () => {
    const input = JSON.parse(String.raw`{
      "\u20ac": "Euro Sign",
      "\r": "Carriage Return",
      "\ufb33": "Hebrew Letter Dalet With Dagesh",
      "1": "One",
      "\ud83d\ude00": "Emoji: Grinning Face",
      "\u0080": "Control",
      "\u00f6": "Latin Small Letter O With Diaeresis"
    }`);
    // Read the values in output order (Object.values would move the integer-like key "1" first).
    const values = [...canonicalize(input).matchAll(/:"([^"]*)"/g)].map((m) => m[1]);
    expect(values).toEqual([
      "Carriage Return",
      "One",
      "Control",
      "Latin Small Letter O With Diaeresis",
      "Euro Sign",
      "Emoji: Grinning Face",
      "Hebrew Letter Dalet With Dagesh",
    ]);
    expect(canonicalize(input)).toBe(
      '{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis",' +
        '"\u20ac":"Euro Sign","\ud83d\ude00":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}',
    );
  });

  test("a surrogate pair sorts by its high surrogate, before characters above U+D83D but after U+20AC", () => {
    const input = { "\ufb33": 1, "\u0435": 2, "\ud83d\ude00": 3, "\u20ac": 4, "\u00f6": 5, z: 6 };
    expect(canonicalize(input)).toBe('{"z":6,"\u00f6":5,"\u0435":2,"\u20ac":4,"\ud83d\ude00":3,"\ufb33":1}');
  });

  test("key order is by code units, not by code points or locale", () => {
    // U+FF61 is above the high surrogate U+D800 as a code unit, though below U+10000 as a code point.
    const input = { "\uff61": "halfwidth", "\u{10000}": "linear b", a: "a", B: "B", "\u00e9": "e acute" };
    expect(canonicalize(input)).toBe(
      '{"B":"B","a":"a","\u00e9":"e acute","\u{10000}":"linear b","\uff61":"halfwidth"}',
    );
  });

  test("the full example of section 3.2.2 serialises exactly as the RFC shows", () => {
    const input = JSON.parse(String.raw`{
      "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }`);
    expect(canonicalize(input)).toBe(
      // Not one String.raw: Bun's transpiler escapes non-ASCII source text inside template literals.
      '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"' +
        "\u20ac" +
        String.raw`$\u000f\nA'B\"\\\\\"/"}`,
    );
  });
});

describe("numbers", () => {
  const cases: [string, string][] = [
    ["0", "0"],
    ["-0", "0"],
    ["1", "1"],
    ["-1", "-1"],
    ["4.50", "4.5"],
    ["2e-3", "0.002"],
    ["0.000001", "0.000001"],
    ["1E-7", "1e-7"],
    ["1e21", "1e+21"],
    ["1E30", "1e+30"],
    ["1e20", "100000000000000000000"],
    ["333333333.33333329", "333333333.3333333"],
    ["9007199254740992", "9007199254740992"],
    ["-9007199254740992", "-9007199254740992"],
    ["295147905179352830000", "295147905179352830000"],
    ["9.999999999999997e22", "9.999999999999997e+22"],
    ["5e-324", "5e-324"],
    ["-5e-324", "-5e-324"],
    ["1.7976931348623157e308", "1.7976931348623157e+308"],
    ["-1.7976931348623157e308", "-1.7976931348623157e+308"],
  ];
  for (const [source, expected] of cases) {
    test(`the JSON number ${source} is written in ECMAScript shortest form as ${expected}`, () => {
      const value = Number(source);
      expect(canonicalize(value)).toBe(expected);
      expect(canonicalize([value])).toBe(`[${expected}]`);
      expect(canonicalize(JSON.parse(`{"n":${source}}`))).toBe(`{"n":${expected}}`);
    });
  }

  test("negative zero inside an object is written as 0", () => {
    expect(canonicalize({ a: -0 })).toBe('{"a":0}');
  });

  test("NaN and both infinities are rejected rather than written as null", () => {
    for (const bad of [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]) {
      expect(() => canonicalize(bad)).toThrow();
      expect(() => canonicalize({ a: bad })).toThrow();
      expect(() => canonicalize([1, [bad]])).toThrow();
    }
  });
});

describe("strings", () => {
  test("the short escapes are used for backspace, tab, newline, form feed and carriage return", () => {
    expect(canonicalize("\b\t\n\f\r")).toBe(String.raw`"\b\t\n\f\r"`);
  });

  test("every other control character is escaped as \\u00XX in lower-case hex", () => {
    const short: Record<number, string> = { 8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r" };
    for (let code = 0; code < 0x20; code++) {
      const expected = short[code] ?? `\\u${code.toString(16).padStart(4, "0")}`;
      expect(canonicalize(String.fromCharCode(code))).toBe(`"${expected}"`);
    }
    expect(canonicalize("\u001f\u000b\u001a")).toBe(String.raw`"\u001f\u000b\u001a"`);
  });

  test("quotes and backslashes are escaped, and the solidus is not", () => {
    expect(canonicalize('a"b\\c/d')).toBe(String.raw`"a\"b\\c/d"`);
  });

  test("DEL and non-ASCII characters are written literally, not escaped", () => {
    expect(canonicalize("\u007f\u00e9\u20ac\ud83d\ude00\u0435")).toBe(
      '"\u007f\u00e9\u20ac\ud83d\ude00\u0435"',
    );
  });

  test("keys are escaped the same way as values", () => {
    expect(canonicalize({ "a\nb": 1, "\u0001": 2 })).toBe(String.raw`{"\u0001":2,"a\nb":1}`);
  });
});

describe("structure", () => {
  test("literals serialise as JSON literals", () => {
    expect(canonicalize(null)).toBe("null");
    expect(canonicalize(true)).toBe("true");
    expect(canonicalize(false)).toBe("false");
  });

  test("nested objects and arrays are sorted at every level and keep array order", () => {
    const input = {
      b: [3, { z: 1, a: [{ y: true, x: null }] }, "s"],
      a: { d: {}, c: [] },
    };
    expect(canonicalize(input)).toBe('{"a":{"c":[],"d":{}},"b":[3,{"a":[{"x":null,"y":true}],"z":1},"s"]}');
  });

  test("no whitespace is emitted between tokens", () => {
    const out = canonicalize({ a: [1, 2, { b: "c d" }], e: null });
    expect(out).toBe('{"a":[1,2,{"b":"c d"}],"e":null}');
  });

  test("object members whose value is undefined are dropped", () => {
    expect(canonicalize({ a: undefined, b: 1, c: { d: undefined } })).toBe('{"b":1,"c":{}}');
  });

  test("insertion order does not change the output", () => {
    expect(canonicalize({ b: 1, a: 2 })).toBe(canonicalize({ a: 2, b: 1 }));
  });

  test("the output parses back to an equal value", () => {
    const input = { n: [0.1, -2, 1e-7], s: "\u2028x\u0000", o: { k: [true, null] } };
    expect(JSON.parse(canonicalize(input))).toEqual(input);
  });

  test("values JSON cannot represent are rejected", () => {
    expect(() => canonicalize(10n)).toThrow();
    expect(() => canonicalize(Symbol("s"))).toThrow();
    expect(() => canonicalize(() => 1)).toThrow();
  });
});
