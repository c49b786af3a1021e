import fc from "fast-check";
import { ID_PREFIXES } from "../../src/domain/ids.ts";
import {
  type FuzzContext,
  type Operation,
  type Schema,
  sometimes,
  text,
  validFor,
  valueFor,
} from "./fuzz-values.ts";

/**
 * Hostile HTTP requests for one operation of the OpenAPI document: path, query, body bytes,
 * content type and headers, each sometimes right and often not. Used by test/api/fuzz.test.ts.
 */
/** JSON text put in place of one member's value; the numbers are ones JSON.stringify cannot write. */
const SWAPS = [
  "1e400",
  "-1e400",
  "1e-400",
  "123456789012345678901234567890",
  "-0.0",
  "1E+2",
  '"\\ud800"',
  '"\\u0000"',
  `"${"a".repeat(300)}"`,
  '""',
  "[]",
  "{}",
  "null",
  "true",
  "-1",
  '{"__proto__":{"x":1}}',
];
/** A scalar member value in JSON text (a naive match: it may also hit text inside strings). */
const MEMBER_VALUE = /:("(?:[^"\\]|\\.)*"|-?\d[\d.eE+-]*|true|false|null)/g;

/** A body as bytes on the wire: well-formed JSON of any shape, or something that is not JSON at all. */
export function bodyFor(
  schema: Schema | undefined,
  ctx: FuzzContext,
): fc.Arbitrary<{ bytes: Uint8Array; contentType: string | null }> {
  const encoder = new TextEncoder();
  const deep = (n: number) => `${"[".repeat(n)}${"]".repeat(n)}`;
  const malformed = fc.oneof(
    text(200),
    fc.uint8Array({ minLength: 1, maxLength: 64 }),
    fc.constantFrom<string | Uint8Array>(
      "{",
      '{"a":',
      "nul",
      "1e400",
      '{"x":1e400}',
      '{"x":-1e400}',
      "\uFEFF{}",
      "[]",
      '"string"',
      "0",
      "null",
      '{"name":"a","name":1}',
      deep(33),
      deep(5_000),
      `{"name":"${"a".repeat(70_000)}"}`,
      `{"a":"${"😀".repeat(20_000)}"}`,
      new Uint8Array([0xff, 0xfe, 0x7b, 0x7d]),
      new Uint8Array([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xc3, 0x28, 0x22, 0x7d]),
      new Uint8Array([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xed, 0xa0, 0x80, 0x22, 0x7d]),
    ),
  );
  // A valid body with one member swapped for something hostile reaches code deep behind the
  // schema check; JSON.stringify could not even write some of the swaps (1e400 parses to Infinity).
  const swapped = fc
    .tuple(validFor(schema, ctx), fc.nat(), fc.constantFrom(...SWAPS))
    .map(([value, at, swap]) => {
      const text = JSON.stringify(value) ?? "";
      const count = (text.match(MEMBER_VALUE) ?? []).length;
      let seen = 0;
      return count === 0
        ? text
        : text.replace(MEMBER_VALUE, (whole) => (seen++ === at % count ? `:${swap}` : whole));
    });
  const json = fc.oneof(
    { weight: 2, arbitrary: validFor(schema, ctx).map((value) => JSON.stringify(value) ?? "") },
    { weight: 3, arbitrary: swapped },
    {
      weight: 3,
      arbitrary: (schema ? valueFor(schema, ctx) : fc.jsonValue({ maxDepth: 3 })).map(
        (value) => JSON.stringify(value) ?? "",
      ),
    },
  );
  const contentType = fc.oneof(
    { weight: 8, arbitrary: fc.constant("application/json") },
    {
      weight: 2,
      arbitrary: fc.constantFrom(
        null,
        "application/json; charset=utf-8",
        "APPLICATION/JSON",
        "application/json; charset=latin1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json, text/plain",
        "application/jsonx",
        "",
      ),
    },
  );
  return fc
    .tuple(fc.oneof({ weight: 4, arbitrary: json }, { weight: 1, arbitrary: malformed }), contentType)
    .map(([bytes, type]) => ({
      bytes: typeof bytes === "string" ? encoder.encode(bytes) : bytes,
      contentType: type,
    }));
}

/**
 * The ids that name what a path parameter names, judged from its name (`product_id`) or the
 * collection before it (`/licenses/{id}`), so most requests reach a real resource and go on to
 * body validation and the service logic behind it.
 */
function idsFitting(ctx: FuzzContext, path: string, name: string): string[] {
  const segments = path.split("/");
  const collection = name === "id" ? (segments[segments.indexOf(`{${name}}`) - 1] ?? "") : name;
  const plain = collection.replace(/[-_]/g, "").toLowerCase();
  const prefixes = Object.entries(ID_PREFIXES)
    .filter(([kind]) => plain.includes(kind.toLowerCase().replace(/y$/, "")))
    .map(([, prefix]) => `${prefix}_`);
  return ctx.ids.filter((id) => prefixes.some((prefix) => id.startsWith(prefix)));
}

/**
 * A URL cannot carry a lone surrogate, so those become U+FFFD here; the raw bytes a client could
 * still send instead (`%ED%A0%80`) are among the path and query constants.
 */
const encode = (value: string) => encodeURIComponent(value.toWellFormed());

/** A path parameter, as it appears in the URL: sometimes a real id, often not, sometimes badly encoded. */
export function pathParam(ctx: FuzzContext, path: string, name: string): fc.Arbitrary<string> {
  const fitting = ctx.examples[name] ?? idsFitting(ctx, path, name);
  return fc.oneof(
    { weight: 4, arbitrary: fc.constantFrom(...(fitting.length > 0 ? fitting : ctx.ids)) },
    { weight: 1, arbitrary: fc.constantFrom(...ctx.ids) },
    { weight: 3, arbitrary: text(60).map(encode) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        "%",
        "%zz",
        "%E0%A4%A",
        "%FF%FE",
        "%C0%AF",
        "%ED%A0%80",
        "%2F",
        "..",
        "%2e%2e",
        "prod_00000000000000000000000000",
        "lic_ZZZZZZZZZZZZZZZZZZZZZZZZZZ",
        "a".repeat(5_000),
        "%00",
        ";",
        "a%20b",
      ),
    },
  );
}

/** A query string: declared parameters with fuzzed values, unknown ones, duplicates, bad encodings. */
export function queryFor(op: Operation, ctx: FuzzContext): fc.Arbitrary<string> {
  const declared = op.parameters.filter((p) => p.in === "query");
  const pair = (name: string, schema?: Schema) =>
    fc
      .oneof(
        fc
          .oneof(validFor(schema, ctx), valueFor(schema, ctx))
          .map((v) => encode(typeof v === "string" ? v : (JSON.stringify(v) ?? ""))),
        fc.constantFrom("%", "%zz", "%FF", "%ED%A0%80", "", "0", "201", "-1", "1.5", "1e3", "50&limit=0"),
      )
      .map((value) => `${encode(name)}=${value}`);
  const pairs = [
    ...declared.map((p) => sometimes(pair(p.name, p.schema), 2, undefined)),
    // The same parameter twice, an unknown one, and bare separators: each now and then.
    ...declared.map((p) => sometimes(pair(p.name, p.schema), 8, undefined)),
    sometimes(
      fc.tuple(text(10), text(10)).map(([k, v]) => `${encode(k)}=${encode(v)}`),
      6,
      undefined,
    ),
    sometimes(fc.constantFrom("&&", "=", "a", "==", "%=%", "limit"), 8, undefined),
  ];
  return fc.tuple(...pairs).map((parts) => {
    const present = parts.filter((p): p is string => p !== undefined);
    return present.length > 0 ? `?${present.join("&")}` : "";
  });
}

/** Header values are byte strings: visible latin-1, which is as far as a client can go. */
const latin1 = (max: number) =>
  fc.string({
    unit: fc
      .integer({ min: 0x21, max: 0xff })
      .filter((c) => c !== 0x7f)
      .map((c) => String.fromCharCode(c)),
    maxLength: max,
  });

export type HeaderList = [string, string][];

/** Authorization, idempotency, preconditions, device-proof and assorted odd headers. */
export function headersFor(op: Operation, ctx: FuzzContext): fc.Arbitrary<HeaderList> {
  const management = op.path.startsWith("/mgmt/");
  const has = (name: string) => op.parameters.some((p) => p.in === "header" && p.name === name);
  const none = fc.constant<HeaderList>([]);
  const bearer = (key: string): HeaderList => [["authorization", `Bearer ${key}`]];
  const auth = fc.oneof(
    { weight: management ? 12 : 1, arbitrary: fc.constant(bearer(ctx.keys.live)) },
    { weight: management ? 0 : 3, arbitrary: fc.constantFrom(...ctx.otherTokens).map(bearer) },
    { weight: management ? 1 : 6, arbitrary: none },
    {
      weight: 2,
      arbitrary: fc.constantFrom<HeaderList>(
        bearer(ctx.keys.test),
        [...bearer(ctx.keys.live), ...bearer(ctx.keys.live)],
        [...bearer(ctx.keys.live), ["authorization", "Bearer nope"]],
        [["authorization", `bearer ${ctx.keys.live}`]],
        [["authorization", `Bearer  ${ctx.keys.live}`]],
        [["authorization", `Bearer ${"a".repeat(20_000)}`]],
        [["authorization", "Bearer"]],
        [["authorization", `Basic ${ctx.keys.live}`]],
        [["authorization", `Bearer ${ctx.keys.live.slice(0, -1)}ÿ`]],
      ),
    },
  );
  const idempotency = has("idempotency-key")
    ? fc.oneof(
        { weight: 6, arbitrary: fc.uuid().map((u): HeaderList => [["idempotency-key", `fuzz-${u}`]]) },
        { weight: 1, arbitrary: none },
        {
          weight: 2,
          arbitrary: fc.oneof(
            fc.constant<HeaderList>([["idempotency-key", "fuzz-shared-key-00001"]]),
            fc.constant<HeaderList>([["idempotency-key", "short"]]),
            fc.constant<HeaderList>([["idempotency-key", "k".repeat(256)]]),
            fc.constant<HeaderList>([
              ["idempotency-key", "fuzz-duplicate-0001"],
              ["idempotency-key", "fuzz-duplicate-0002"],
            ]),
            latin1(300).map((v): HeaderList => [["idempotency-key", v]]),
          ),
        },
      )
    : sometimes(
        latin1(40).map((v): HeaderList => [["idempotency-key", v]]),
        8,
        [] as HeaderList,
      );
  const ifMatch = sometimes(
    fc
      .oneof(
        fc.constantFrom("*", "1", '"1"', 'W/"1"', "-1", "0", "99999999999999999999", '"', "1, 2", "1e3"),
        latin1(60),
      )
      .map((v): HeaderList => [["if-match", v]]),
    has("if-match") ? 3 : 10,
    [] as HeaderList,
  );
  const device = op.path.startsWith("/runtime/")
    ? fc
        .tuple(
          ...["x-service-activation", "x-service-timestamp", "x-service-nonce", "x-service-signature"].map(
            (name) =>
              sometimes(
                fc
                  .oneof(
                    latin1(80),
                    fc.constantFrom(...ctx.ids),
                    fc.constantFrom("0", "-1", "99999999999", "1.5", "a".repeat(300)),
                  )
                  .map((v): [string, string] => [name, v]),
                2,
                undefined,
              ),
          ),
        )
        .map((list) => list.filter((h): h is [string, string] => h !== undefined))
    : none;
  const odd = sometimes(
    fc.constantFrom<HeaderList>(
      [["x-fuzz-large", "a".repeat(16_000)]],
      [["content-length", "99999999"]],
      [["content-length", "-1"]],
      [["content-encoding", "gzip"]],
      [["accept", "application/xml"]],
      [["x-request-id", "req_spoofed"]],
      [["transfer-encoding", "chunked"]],
      [["x-forwarded-for", "::1, 127.0.0.1, ÿÿ"]],
    ),
    5,
    [] as HeaderList,
  );
  return fc.tuple(auth, idempotency, ifMatch, device, odd).map((groups) => groups.flat() as HeaderList);
}
