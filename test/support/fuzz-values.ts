import fc from "fast-check";

/**
 * fast-check arbitraries for JSON values from the schemas of an OpenAPI document: strictly valid
 * ones (so requests get past validation into the services), almost right ones (boundaries, enum
 * members, real ids) and plainly wrong or hostile ones (other JSON types, unicode edge cases,
 * oversized). test/support/fuzz-requests.ts turns them into requests.
 */
export type Schema = Record<string, unknown>;

export interface Operation {
  method: string;
  /** OpenAPI template, `{id}` style. */
  path: string;
  parameters: { in: string; name: string; required?: boolean; schema?: Schema }[];
  body?: Schema;
}

export interface FuzzContext {
  schemas: Record<string, Schema>;
  /** Ids of real resources, so some requests get past "not found" into validation and logic. */
  ids: readonly string[];
  keys: { live: string; test: string };
  /** Bearer tokens of routes outside the Management API (the metrics token). */
  otherTokens: string[];
  /** Values that exist for path parameters no id names (`{file}` of the docs assets). */
  examples: Record<string, string[]>;
}

const MAX_DEPTH = 4;

/** Strings that break naive code: surrogates, controls, direction marks, normalisation traps. */
const NASTY_STRINGS = [
  "",
  " ",
  "\u0000",
  "\uD800",
  "\uDFFF",
  "\u202Eevil",
  "\u200B",
  "e\u0301",
  "\uFEFF",
  "😀",
  "𝕏".repeat(40),
  "%00",
  "%",
  "%zz",
  "../../etc/passwd",
  "__proto__",
  "constructor",
  "toString",
  "null",
  "undefined",
  "NaN",
  "-0",
  "1e400",
  "0x10",
  "' OR 1=1 --",
  '"; DROP TABLE licenses; --',
  "<script>alert(1)</script>",
  "{{7*7}}",
  "a".repeat(10_000),
];

const NASTY_NUMBERS = [
  0,
  -0,
  -1,
  1,
  1.5,
  -1.5,
  2 ** 31,
  2 ** 32,
  Number.MAX_SAFE_INTEGER,
  Number.MAX_SAFE_INTEGER + 2,
  -Number.MAX_SAFE_INTEGER - 2,
  1e21,
  Number.MAX_VALUE,
  Number.MIN_VALUE,
];

const DATES = [
  "2026-01-01T00:00:00.000Z",
  "2999-12-31T23:59:59Z",
  "9999-12-31T23:59:59.999Z",
  "+275760-09-13T00:00:00.000Z",
  "0000-01-01T00:00:00Z",
  "1970-01-01T00:00:00Z",
  "2026-02-30T00:00:00Z",
  "2026-13-01T00:00:00Z",
  "2026-01-01",
  "2026-01-01T00:00:00+14:00",
  "2026-01-01T24:00:00Z",
];

export const text = (max = 40) =>
  fc.oneof(
    fc.string({ maxLength: max }),
    fc.string({ unit: "grapheme", maxLength: max }),
    fc.string({ unit: "binary", maxLength: max }),
    fc.constantFrom(...NASTY_STRINGS),
  );

/** Any JSON value of the wrong kind, for where a schema wants something else. */
const hostileValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.constantFrom(...NASTY_NUMBERS),
  text(),
  fc.constant([]),
  fc.constant({}),
  fc.jsonValue({ maxDepth: 2 }),
  fc.constant(JSON.parse('{"__proto__":{"polluted":true},"constructor":{"prototype":{"x":1}}}')),
  fc.constant(JSON.parse('{"toString":null,"valueOf":null}')),
);

export function resolve(schema: Schema | undefined, ctx: FuzzContext): Schema {
  const ref = schema?.$ref;
  if (typeof ref === "string") return ctx.schemas[ref.replace("#/components/schemas/", "")] ?? {};
  return schema ?? {};
}

/** Mostly a value of roughly the right shape, sometimes a wrong or hostile one. */
export function valueFor(schema: Schema | undefined, ctx: FuzzContext, depth = 0): fc.Arbitrary<unknown> {
  if (depth > MAX_DEPTH) return hostileValue;
  return fc.oneof(
    { weight: 5, arbitrary: shaped(resolve(schema, ctx), ctx, depth) },
    { weight: 1, arbitrary: hostileValue },
  );
}

function shaped(s: Schema, ctx: FuzzContext, depth: number): fc.Arbitrary<unknown> {
  if ("const" in s) return fc.constant(s.const);
  if (Array.isArray(s.enum)) return fc.oneof(fc.constantFrom(...s.enum), text(12));
  const branches = (s.anyOf ?? s.oneOf ?? s.allOf) as Schema[] | undefined;
  if (Array.isArray(branches) && branches.length > 0) {
    return fc.oneof(
      ...branches.map((branch) =>
        shaped(
          resolve({ ...s, ...branch, anyOf: undefined, oneOf: undefined, allOf: undefined }, ctx),
          ctx,
          depth,
        ),
      ),
    );
  }
  const types = Array.isArray(s.type) ? (s.type as string[]) : typeof s.type === "string" ? [s.type] : [];
  if (types.length === 0) return s.properties ? objectFor(s, ctx, depth) : fc.jsonValue({ maxDepth: 2 });
  return fc.oneof(...types.map((type) => byType(type, s, ctx, depth)));
}

function byType(type: string, s: Schema, ctx: FuzzContext, depth: number): fc.Arbitrary<unknown> {
  switch (type) {
    case "string":
      return stringFor(s, ctx);
    case "integer":
    case "number":
      return numberFor(s, type === "integer");
    case "boolean":
      return fc.boolean();
    case "null":
      return fc.constant(null);
    case "array": {
      const items = valueFor(s.items as Schema | undefined, ctx, depth + 1);
      const max = typeof s.maxItems === "number" ? s.maxItems : undefined;
      return fc.oneof(
        fc.array(items, { maxLength: Math.min(max ?? 4, 4) }),
        ...(max !== undefined && max <= 300
          ? [fc.array(items, { minLength: max + 1, maxLength: max + 1 })]
          : []),
      );
    }
    default:
      return objectFor(s, ctx, depth);
  }
}

function stringFor(s: Schema, ctx: FuzzContext): fc.Arbitrary<string> {
  const min = typeof s.minLength === "number" ? s.minLength : 0;
  const max = typeof s.maxLength === "number" ? s.maxLength : undefined;
  const options: fc.Arbitrary<string>[] = [
    text(Math.min(max ?? 40, 40)),
    fc.constantFrom(...ctx.ids),
    fc.constantFrom(...ctx.ids).map((id) => id.toLowerCase()),
  ];
  if (max !== undefined) {
    options.push(fc.constantFrom("x".repeat(max), "x".repeat(max + 1), "é".repeat(max), "😀".repeat(max)));
  }
  if (min > 0) options.push(fc.constant("x".repeat(min - 1)));
  if (s.format === "date-time") {
    options.push(
      fc.constantFrom(...DATES),
      fc.date({ noInvalidDate: true }).map((d) => d.toISOString()),
    );
  }
  if (s.format === "uri") {
    options.push(
      fc.constantFrom("https://example.com/x", "http://127.0.0.1/", "javascript:alert(1)", "http://[::1"),
    );
  }
  if (typeof s.pattern === "string") {
    try {
      options.push(fc.stringMatching(new RegExp(s.pattern)));
    } catch {
      // A pattern JavaScript cannot compile is fuzzed with the other strings only.
    }
  }
  return fc.oneof(...options);
}

function numberFor(s: Schema, integer: boolean): fc.Arbitrary<number> {
  const min = typeof s.minimum === "number" ? s.minimum : undefined;
  const max = typeof s.maximum === "number" ? s.maximum : undefined;
  const edges = [
    min,
    max,
    min !== undefined ? min - 1 : undefined,
    max !== undefined ? max + 1 : undefined,
  ].filter((n): n is number => n !== undefined);
  return fc.oneof(
    fc.integer(),
    fc.constantFrom(...NASTY_NUMBERS, ...edges),
    integer
      ? fc.integer({ min: min ?? -1000, max: max ?? 1000 })
      : fc.double({ noNaN: true, noDefaultInfinity: true }),
  );
}

function objectFor(s: Schema, ctx: FuzzContext, depth: number): fc.Arbitrary<Record<string, unknown>> {
  const properties = (s.properties ?? {}) as Record<string, Schema>;
  const required = new Set(Array.isArray(s.required) ? (s.required as string[]) : []);
  const model: Record<string, fc.Arbitrary<unknown>> = {};
  for (const [name, property] of Object.entries(properties)) model[name] = valueFor(property, ctx, depth + 1);
  const extraSchema = (s.additionalProperties ?? Object.values((s.patternProperties ?? {}) as object)[0]) as
    | Schema
    | boolean
    | undefined;
  const extraValue = typeof extraSchema === "object" ? valueFor(extraSchema, ctx, depth + 1) : hostileValue;
  const maxProperties = typeof s.maxProperties === "number" ? s.maxProperties : undefined;
  return fc
    .tuple(
      fc.record(model, { requiredKeys: [] }),
      fc.boolean(),
      fc.dictionary(text(12), extraValue, { maxKeys: 3 }),
      fc.boolean(),
      fc.boolean(),
    )
    .map(([values, keepRequired, extras, addExtras, overfill]) => {
      const out: Record<string, unknown> = Object.create(null);
      for (const [name, value] of Object.entries(values)) out[name] = value;
      // Usually every required field is there, so the request gets past "missing field" errors.
      if (keepRequired) for (const name of required) if (!(name in out)) out[name] = "x";
      if (addExtras) Object.assign(out, extras);
      if (overfill && maxProperties !== undefined && maxProperties <= 300) {
        for (let i = 0; i <= maxProperties; i++) out[`k${i}`] = i;
      }
      return out;
    });
}

/** `arbitrary` once in `every` draws, `otherwise` the rest of the time. */
export function sometimes<T, N>(
  arbitrary: fc.Arbitrary<T>,
  every: number,
  otherwise: N,
): fc.Arbitrary<T | N> {
  return fc.oneof({ weight: every - 1, arbitrary: fc.constant(otherwise) }, { weight: 1, arbitrary });
}

/**
 * A value the schema accepts, as far as JSON Schema can say (the service may still refuse it by
 * its own rules), so a request gets past validation into the logic behind it; a body built from
 * it then has one member swapped for something hostile (see fuzz-requests.ts).
 */
export function validFor(schema: Schema | undefined, ctx: FuzzContext, depth = 0): fc.Arbitrary<unknown> {
  const s = resolve(schema, ctx);
  if ("const" in s) return fc.constant(s.const);
  if (Array.isArray(s.enum)) return fc.constantFrom(...s.enum);
  const branches = (s.anyOf ?? s.oneOf) as Schema[] | undefined;
  if (Array.isArray(branches) && branches.length > 0) {
    return fc.oneof(
      ...branches.map((branch) =>
        validFor({ ...s, anyOf: undefined, oneOf: undefined, ...branch }, ctx, depth),
      ),
    );
  }
  const types = Array.isArray(s.type) ? (s.type as string[]) : typeof s.type === "string" ? [s.type] : [];
  if (types.length === 0) {
    if (s.properties) return validObject(s, ctx, depth);
    return depth > MAX_DEPTH ? fc.constant(null) : fc.jsonValue({ maxDepth: 1 });
  }
  return fc.oneof(
    ...types.map((type): fc.Arbitrary<unknown> => {
      const min = typeof s.minimum === "number" ? s.minimum : -1_000_000;
      const max = typeof s.maximum === "number" ? s.maximum : 1_000_000;
      switch (type) {
        case "string":
          return validString(s, ctx);
        case "integer":
        case "number":
          return fc.integer({ min, max });
        case "boolean":
          return fc.boolean();
        case "null":
          return fc.constant(null);
        case "array":
          return fc.array(validFor(s.items as Schema | undefined, ctx, depth + 1), {
            minLength: typeof s.minItems === "number" ? s.minItems : 0,
            maxLength: Math.min(typeof s.maxItems === "number" ? s.maxItems : 3, 3),
          });
        default:
          return validObject(s, ctx, depth);
      }
    }),
  );
}

function validString(s: Schema, ctx: FuzzContext): fc.Arbitrary<string> {
  const min = typeof s.minLength === "number" ? s.minLength : 0;
  const max = typeof s.maxLength === "number" ? s.maxLength : Number.POSITIVE_INFINITY;
  const fits = (value: string) => value.length >= min && value.length <= max;
  if (s.format === "date-time") {
    return fc
      .date({
        min: new Date("2027-01-01T00:00:00Z"),
        max: new Date("2035-01-01T00:00:00Z"),
        noInvalidDate: true,
      })
      .map((d) => d.toISOString());
  }
  if (s.format === "integer") return fc.integer({ min: 1, max: 200 }).map(String);
  if (s.format === "uri") return fc.constant("https://example.com/hook");
  if (typeof s.pattern === "string") {
    try {
      return fc.stringMatching(new RegExp(s.pattern)).filter(fits);
    } catch {
      // A pattern JavaScript cannot compile: plain strings below.
    }
  }
  const ids = ctx.ids.filter(fits);
  return fc.oneof(
    fc.string({ minLength: min, maxLength: Math.max(min, Math.min(max, 24)) }).filter(fits),
    ...(ids.length > 0 ? [fc.constantFrom(...ids)] : []),
  );
}

function validObject(s: Schema, ctx: FuzzContext, depth: number): fc.Arbitrary<Record<string, unknown>> {
  const properties = (s.properties ?? {}) as Record<string, Schema>;
  const required = Array.isArray(s.required) ? (s.required as string[]) : [];
  const model: Record<string, fc.Arbitrary<unknown>> = {};
  for (const [name, property] of Object.entries(properties)) model[name] = validFor(property, ctx, depth + 1);
  const extra = (s.additionalProperties ?? Object.values((s.patternProperties ?? {}) as object)[0]) as
    | Schema
    | boolean
    | undefined;
  const maxProperties = typeof s.maxProperties === "number" ? s.maxProperties : 3;
  const extras =
    typeof extra === "object" && depth <= MAX_DEPTH
      ? fc.dictionary(fc.string({ minLength: 1, maxLength: 10 }), validFor(extra, ctx, depth + 1), {
          maxKeys: Math.max(0, Math.min(2, maxProperties - Object.keys(properties).length)),
        })
      : fc.constant({});
  return fc.tuple(fc.record(model, { requiredKeys: required }), extras).map(([known, more]) => {
    const out: Record<string, unknown> = Object.create(null);
    for (const [name, value] of Object.entries(more)) if (!(name in properties)) out[name] = value;
    for (const [name, value] of Object.entries(known)) out[name] = value;
    return out;
  });
}
