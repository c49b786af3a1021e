import { type IntegerOptions, type TSchema, Type } from "@sinclair/typebox";
import type { FieldErrorCollector } from "./errors.ts";
import { IF_MATCH_MAX_LENGTH } from "./preconditions.ts";

/** Shared schema pieces: the error envelope every failure uses, and the data/list wrappers. */
export const ErrorEnvelope = Type.Object(
  {
    error: Type.Object({
      code: Type.String({ description: "Stable SCREAMING_SNAKE code; see /docs/errors." }),
      message: Type.String(),
      request_id: Type.String({ description: "Equals the X-Request-Id response header." }),
      retryable: Type.Boolean(),
      doc_url: Type.String({ format: "uri" }),
      details: Type.Record(Type.String(), Type.Unknown()),
    }),
  },
  { description: "The error envelope of every failed request." },
);

/** An OpenAPI response whose body is the error envelope, for statuses a route documents itself. */
export const errorEnvelopeResponse = (description: string) => ({
  description,
  content: { "application/json": { schema: { $ref: "#/components/schemas/ErrorEnvelope" } } },
});

/**
 * The success answer of a route whose handler sends the resource's ETag: the OpenAPI document
 * adds the header to the answer the route's response schema describes.
 */
export const WithEtag = {
  description: "The resource; the ETag header carries its entity-tag for If-Match.",
  headers: { ETag: { $ref: "#/components/headers/ETag" } },
};

/** A reference to another resource by its public id. */
export const IdField = (description?: string) =>
  Type.String({ minLength: 1, maxLength: 64, ...(description ? { description } : {}) });

/**
 * C0, DEL and C1, as the inside of a regular expression's character class: what no one-line text
 * we take (names, the mail From) may hold, and what a terminal listing escapes.
 */
export const CONTROL_CHARACTERS = "\\u0000-\\u001f\\u007f-\\u009f";
/** U+2028 and U+2029: line breaks to browsers, JavaScript and many renderers, though not controls. */
const LINE_SEPARATORS = "\\u2028\\u2029";

/**
 * A display name: one line of 1-200 characters with no control characters (C0, DEL, C1) and no
 * Unicode line or paragraph separator. Names are printed by the command line and shown in
 * dashboards, where an ESC or a line break could forge output; descriptions and notes, which may
 * span lines, are not names.
 */
export const NameField = (description?: string) =>
  Type.String({
    minLength: 1,
    maxLength: 200,
    pattern: `^[^${CONTROL_CHARACTERS}${LINE_SEPARATORS}]*$`,
    "x-rule": "must be one line of 1 to 200 characters without control characters",
    ...(description ? { description } : {}),
  });

export const DateTime = (description?: string) =>
  Type.String({ format: "date-time", ...(description ? { description } : {}) });
export const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);

export const dataOf = <T extends TSchema>(schema: T) => Type.Object({ data: schema });

export const listOf = <T extends TSchema>(schema: T) =>
  Type.Object({
    data: Type.Array(schema),
    pagination: Type.Object({
      next_cursor: Nullable(
        Type.String({ description: "Pass as `cursor` for the next page; null on the last page." }),
      ),
      has_more: Type.Boolean(),
    }),
  });

/**
 * An integer a request may send, bounded to what JSON carries exactly (I-JSON, RFC 7493): within
 * ±(2^53−1). A bare `Type.Integer()` takes 1e308, and 9007199254740993 (already rounded to 2^53 by
 * the JSON parser); either would then be stored, echoed or signed as a number no other party reads
 * back the same. Narrower bounds where the field has them.
 */
export const SafeInteger = (options: IntegerOptions = {}) =>
  Type.Integer({ minimum: -Number.MAX_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER, ...options });

/** Free-form JSON object (entitlement maps, configuration). */
export const JsonObject = (description: string) =>
  Type.Record(Type.String({ maxLength: 64 }), Type.Unknown(), { description });

export const MAX_METADATA_KEYS = 50;
export const MAX_METADATA_KEY_LENGTH = 64;
/** Metadata as JSON, at most: it is returned with every item of a list (200 a page). */
export const MAX_METADATA_BYTES = 16 * 1024;

/**
 * The vendor's own data on a resource, returned as stored. TypeBox's Record checks no constraint
 * of its key schema, so `propertyNames` only documents the key rule; `checkMetadataKeys` enforces it.
 */
export const Metadata = (
  description = `Your own data, returned as stored (at most ${MAX_METADATA_KEYS} keys of 1-${MAX_METADATA_KEY_LENGTH} characters, ${MAX_METADATA_BYTES} bytes as JSON).`,
) =>
  Type.Record(Type.String(), Type.Unknown(), {
    description,
    maxProperties: MAX_METADATA_KEYS,
    propertyNames: { minLength: 1, maxLength: MAX_METADATA_KEY_LENGTH },
  });

/**
 * Metadata keys are 1-64 characters (code points, as JSON Schema counts): 422 keyed
 * `metadata.<key>`; the whole is at most MAX_METADATA_BYTES as JSON: 422 keyed `metadata`.
 */
export function checkMetadataKeys(
  metadata: Record<string, unknown> | undefined,
  errors: FieldErrorCollector,
): void {
  if (metadata !== undefined && Buffer.byteLength(JSON.stringify(metadata)) > MAX_METADATA_BYTES)
    errors.add("metadata", `at most ${MAX_METADATA_BYTES} bytes as JSON`);
  for (const key of Object.keys(metadata ?? {})) {
    const length = [...key].length;
    if (length < 1 || length > MAX_METADATA_KEY_LENGTH)
      errors.add(`metadata.${key}`, `keys are 1-${MAX_METADATA_KEY_LENGTH} characters`);
  }
}

const IdempotencyKey = Type.String({
  minLength: 16,
  maxLength: 255,
  pattern: "^[\\x21-\\x7E]+$",
  description: "16-255 visible ASCII characters; replays the first response for the same body (docs/api.md).",
});

/** Where the key is optional; a malformed one is still refused (400). */
export const IdempotencyHeaders = Type.Object({ "idempotency-key": Type.Optional(IdempotencyKey) });

/** Creates that must be safe to retry; checked with the other headers, before the body (400). */
export const RequiredIdempotencyHeaders = Type.Object({ "idempotency-key": IdempotencyKey });

/** The DELETE of a resource without an ETag: If-Match is parsed, and only `*` matches. */
export const NoEtagIfMatchHeaders = Type.Object({
  "if-match": Type.Optional(
    Type.String({
      maxLength: IF_MATCH_MAX_LENGTH,
      description:
        "This resource has no ETag: `*` matches, any entity-tag answers 409 VERSION_CONFLICT (`current_etag: null`) and changes nothing; a malformed value 400.",
    }),
  ),
});

export const IfMatchHeaders = Type.Object({
  "if-match": Type.Optional(
    Type.String({
      maxLength: IF_MATCH_MAX_LENGTH,
      description:
        'The resource\'s ETag (`*`, or a comma-separated list of strong entity-tags such as "7"; weak tags never match). A stale value answers 409 VERSION_CONFLICT and changes nothing; a malformed one 400.',
    }),
  ),
});
