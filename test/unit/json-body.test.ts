import { describe, expect, test } from "bun:test";
import { parseJsonBody } from "../../src/http/body.ts";
import { ApiError } from "../../src/http/errors.ts";

const post = (text: string) =>
  new Request("http://licensing.test/x", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: text,
  });

async function refusal(text: string): Promise<string> {
  try {
    await parseJsonBody(post(text));
  } catch (error) {
    if (error instanceof ApiError) return error.code;
    throw error;
  }
  return "accepted";
}

describe("member names repeated within one object (I-JSON, RFC 7493 §2.3)", () => {
  test.each([
    ["at the top", '{"a":1,"a":1}'],
    ["in a nested object", '{"a":{"b":1,"c":{"d":1,"d":2}}}'],
    ["in an object inside an array", '{"a":[1,{"b":1,"b":1}]}'],
    ["spelt once with an escape", '{"name":1,"n\\u0061me":2}'],
    ["with whitespace around the colons", '{ "a" : 1 ,\n "a" :\t2 }'],
  ])("are refused %s", async (_where, text) => {
    expect(await refusal(text)).toBe("INVALID_REQUEST");
  });

  test.each([
    ["colons inside strings", '{"a":"x:y:z","b:c":"::"}'],
    ["escaped quotes and backslashes before colons", '{"a":"\\":","b":"\\\\","c":"\\\\\\":"}'],
    ["the same name in sibling objects", '{"x":{"k":1},"y":{"k":2},"z":[{"k":1},{"k":2}]}'],
    ["arrays of scalars", '{"a":[1,2,3],"b":[]}'],
    ["a bare array", '[{"a":1},{"a":2}]'],
  ])("are not confused with %s", async (_what, text) => {
    expect(await refusal(text)).toBe("accepted");
    expect(await parseJsonBody(post(text))).toEqual(JSON.parse(text));
  });
});

describe("depth, numbers and text checked at every place in the body", () => {
  const details = async (text: string) => {
    try {
      await parseJsonBody(post(text));
    } catch (error) {
      if (error instanceof ApiError)
        return { code: error.code, details: error.details as Record<string, unknown> };
      throw error;
    }
    return { code: "accepted", details: {} as Record<string, unknown> };
  };
  const nested = (levels: number, inner: string) =>
    `${"[".repeat(levels - 1)}${inner}${"]".repeat(levels - 1)}`;

  test("32 levels are taken and 33 refused, whether the innermost is an empty array, an empty object or a value", async () => {
    for (const inner of ["[]", "{}", "[1]", '{"a":1}']) {
      expect((await details(nested(32, inner))).code).toBe("accepted");
      expect(await details(nested(33, inner))).toEqual({
        code: "INVALID_REQUEST",
        details: { max_depth: 32 },
      });
    }
  });

  test("a bad number or text is named by its path, in arrays and objects alike", async () => {
    const field = async (text: string) =>
      Object.keys(((await details(text)).details.errors as object | undefined) ?? {});
    expect(await field('{"a":[1,2,{"b":[0,1e400]}]}')).toEqual(["a.2.b.1"]);
    expect(await field('{"a":{"b":"x\\u0000y"}}')).toEqual(["a.b"]);
    expect(await field('[0,"\\ud800"]')).toEqual(["1"]);
    expect(await field('"\\udc00"')).toEqual(["body"]);
    expect(await field("1e400")).toEqual(["body"]);
  });

  test("a long array of numbers, objects or arrays passes when every element is sound", async () => {
    for (const element of ["0", "{}", "[]", '{"a":"b"}']) {
      expect((await details(`[${Array(5_000).fill(element).join(",")}]`)).code).toBe("accepted");
    }
    expect((await details(`[${Array(5_000).fill("0").join(",")},{"a":1,"a":2}]`)).code).toBe(
      "INVALID_REQUEST",
    );
  });
});
