import { describe, expect, test } from "bun:test";
import { CanonicalizationError, canonicalize } from "../../src/sdk/index.ts";

function fromBits(bits: string): number {
  const view = new DataView(new ArrayBuffer(8));
  view.setBigUint64(0, BigInt(`0x${bits}`));
  return view.getFloat64(0);
}

describe("JCS (RFC 8785)", () => {
  test("the RFC 8785 section 3.2.2 sample canonicalizes to the published output", () => {
    const input = JSON.parse(String.raw`{
      "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }`);
    // Built from escapes: Bun rewrites non-ASCII inside String.raw templates as \u escapes.
    const expected =
      '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],' +
      '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}';
    expect(canonicalize(input)).toBe(expected);
  });

  test("members are sorted by UTF-16 code units as in RFC 8785 section 3.2.3", () => {
    const input = JSON.parse(String.raw`{
      "\u20ac": "Euro Sign",
      "\r": "Carriage Return",
      "\ufb33": "Hebrew Letter Dalet With Dagesh",
      "1": "One",
      "\ud83d\ude00": "Emoji: Grinning Face",
      "\u0080": "Control",
      "\u00f6": "Latin Small Letter O With Diaeresis"
    }`);
    const expected =
      '{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis",' +
      '"\u20ac":"Euro Sign","\ud83d\ude00":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}';
    expect(canonicalize(input)).toBe(expected);
  });

  test("a surrogate pair key sorts before U+FB33 although its code point is larger", () => {
    expect(canonicalize({ "\ufb33": 1, "\ud83d\ude00": 2 })).toBe('{"\ud83d\ude00":2,"\ufb33":1}');
  });

  const numbers: [string, string][] = [
    ["0000000000000000", "0"],
    ["8000000000000000", "0"],
    ["0000000000000001", "5e-324"],
    ["8000000000000001", "-5e-324"],
    ["7fefffffffffffff", "1.7976931348623157e+308"],
    ["ffefffffffffffff", "-1.7976931348623157e+308"],
    ["4340000000000000", "9007199254740992"],
    ["c340000000000000", "-9007199254740992"],
    ["4430000000000000", "295147905179352830000"],
    ["44b52d02c7e14af5", "9.999999999999997e+22"],
    ["44b52d02c7e14af6", "1e+23"],
    ["44b52d02c7e14af7", "1.0000000000000001e+23"],
    ["444b1ae4d6e2ef4e", "999999999999999700000"],
    ["444b1ae4d6e2ef4f", "999999999999999900000"],
    ["444b1ae4d6e2ef50", "1e+21"],
    ["3eb0c6f7a0b5ed8c", "9.999999999999997e-7"],
    ["3eb0c6f7a0b5ed8d", "0.000001"],
    ["41b3de4355555553", "333333333.3333332"],
    ["41b3de4355555554", "333333333.33333325"],
    ["41b3de4355555555", "333333333.3333333"],
    ["41b3de4355555556", "333333333.3333334"],
    ["41b3de4355555557", "333333333.33333343"],
    ["becbf647612f3696", "-0.0000033333333333333333"],
    ["43143ff3c1cb0959", "1424953923781206.2"],
  ];
  for (const [bits, expected] of numbers) {
    test(`the IEEE 754 value 0x${bits} from RFC 8785 appendix B serializes as ${expected}`, () => {
      expect(canonicalize(fromBits(bits))).toBe(expected);
    });
  }

  test("NaN and both infinities are refused", () => {
    for (const bits of ["7ff8000000000000", "7ff0000000000000", "fff0000000000000"]) {
      expect(() => canonicalize(fromBits(bits))).toThrow(CanonicalizationError);
    }
  });

  test("control characters use the short escapes or lowercase \\u00xx and nothing else is escaped", () => {
    const s = '\u0000\u0001\b\t\n\u000b\f\r\u001f "\\/\u007f\u2028é';
    expect(canonicalize(s)).toBe('"\\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f \\"\\\\/\u007f\u2028é"');
  });

  test("lone surrogates in strings and in keys are refused", () => {
    expect(() => canonicalize("a\ud800")).toThrow(CanonicalizationError);
    expect(() => canonicalize("\udc00b")).toThrow(CanonicalizationError);
    expect(() => canonicalize({ "\ud800": 1 })).toThrow(CanonicalizationError);
  });

  test("nested objects and arrays are canonicalized recursively without whitespace", () => {
    const value = { b: [3, { z: 1, a: [true, null] }], a: { d: "x", c: -0 } };
    expect(canonicalize(value)).toBe('{"a":{"c":0,"d":"x"},"b":[3,{"a":[true,null],"z":1}]}');
  });

  test("members whose value is undefined are left out, as JSON.stringify does", () => {
    const value = { a: 1, b: undefined, c: { d: undefined } };
    expect(canonicalize(value)).toBe('{"a":1,"c":{}}');
    expect(canonicalize(value)).toBe(canonicalize(JSON.parse(JSON.stringify(value))));
  });

  test("undefined in arrays, functions, symbols, bigints and class instances are refused", () => {
    expect(() => canonicalize([1, undefined])).toThrow(CanonicalizationError);
    expect(() => canonicalize({ f: () => 1 })).toThrow(CanonicalizationError);
    expect(() => canonicalize(Symbol("x"))).toThrow(CanonicalizationError);
    expect(() => canonicalize(10n)).toThrow(CanonicalizationError);
    expect(() => canonicalize(new Date(0))).toThrow(CanonicalizationError);
  });

  test("canonicalizing parsed canonical output gives the same text again", () => {
    const value = { é: [1, 2.5, "x\u0001"], A: { "": null, b: false }, "10": 1e21 };
    const once = canonicalize(value);
    expect(canonicalize(JSON.parse(once))).toBe(once);
    expect(once).toBe('{"10":1e+21,"A":{"":null,"b":false},"é":[1,2.5,"x\\u0001"]}');
  });
});
