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
