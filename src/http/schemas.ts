import { type TSchema, Type } from "@sinclair/typebox";

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

/** A reference to another resource by its public id. */
export const IdField = (description?: string) =>
  Type.String({ minLength: 1, maxLength: 64, ...(description ? { description } : {}) });

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

/** Free-form JSON object (entitlement maps, configuration). */
export const JsonObject = (description: string) =>
  Type.Record(Type.String({ maxLength: 64 }), Type.Unknown(), { description });

export const MAX_METADATA_KEYS = 50;

/** The vendor's own data on a resource, returned as stored. */
export const Metadata = (
  description = `Your own data, returned as stored (at most ${MAX_METADATA_KEYS} keys).`,
) =>
  Type.Record(Type.String({ maxLength: 64 }), Type.Unknown(), {
    description,
    maxProperties: MAX_METADATA_KEYS,
  });

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

export const IfMatchHeaders = Type.Object({
  "if-match": Type.Optional(
    Type.String({
      description:
        'The resource\'s ETag (`*`, or a comma-separated list of strong entity-tags such as "7"; weak tags never match). A stale value answers 409 VERSION_CONFLICT and changes nothing; a malformed one 400.',
    }),
  ),
});
