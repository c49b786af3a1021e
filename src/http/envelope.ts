import { SQLiteError } from "bun:sqlite";
import type { Static, TSchema } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { ParseError, ValidationError } from "elysia";
import { ApiError, addFieldError, type FieldErrors, newFieldErrors } from "./errors.ts";

export interface ErrorEnvelope {
  error: {
    code: string;
    message: string;
    request_id: string;
    retryable: boolean;
    doc_url: string;
    details: Record<string, unknown>;
  };
}

/** Turns anything thrown during a request into an ApiError; unknown errors become INTERNAL_ERROR. */
export function toApiError(error: unknown, elysiaCode: unknown, request?: Request): ApiError {
  if (error instanceof ApiError) return error;
  if (error instanceof ParseError) {
    if (error.cause instanceof ApiError) return error.cause;
    return new ApiError("INVALID_REQUEST", "The request body could not be read.");
  }
  if (error instanceof ValidationError) return fromValidation(error, request);
  if (error instanceof SQLiteError && STORE_UNAVAILABLE.test(error.code ?? "")) {
    return new ApiError(
      "SERVICE_UNAVAILABLE",
      "The store cannot take this write now (disk full, I/O error or locked); nothing was changed. Retry later.",
      {},
      { headers: { "retry-after": "5" } },
    );
  }
  if (elysiaCode === "NOT_FOUND") return new ApiError("NOT_FOUND", "No route matches this method and path.");
  if (elysiaCode === "INVALID_COOKIE_SIGNATURE" || elysiaCode === "INVALID_FILE_TYPE") {
    return new ApiError("INVALID_REQUEST", "The request is malformed.");
  }
  return new ApiError("INTERNAL_ERROR", "Something went wrong on our side; it has been logged.");
}

/**
 * The store failing for reasons outside the request: a full disk, an I/O error, a lock held too
 * long. The transaction rolled back, so the client may retry; it is not a bug (500).
 */
const STORE_UNAVAILABLE = /^SQLITE_(FULL|IOERR|BUSY|LOCKED|READONLY)/;

/**
 * The store's file damaged (a page SQLite cannot read as what it should be): the answer is the
 * 500 of any unexpected failure, but the log says what it is and what to do, apart from bugs.
 */
export const isStoreDamage = (error: unknown): boolean =>
  error instanceof SQLiteError && /^SQLITE_(CORRUPT|NOTADB)/.test(error.code ?? "");

/**
 * A route's body schema, checked outside the route (the command line's offline request): the
 * value when it fits, else the same 422 and field errors the route's own check answers.
 */
export function checkBody<T extends TSchema>(schema: T, body: unknown): Static<T> {
  if (Value.Check(schema, body)) return body;
  throw fromValidation(new ValidationError("body", schema, body));
}

function fromValidation(error: ValidationError, request?: Request): ApiError {
  if (error.type === "response") {
    return new ApiError("INTERNAL_ERROR", "The server produced a response that breaks its own schema.");
  }
  if (error.type === "body" && error.value === undefined) {
    return new ApiError("INVALID_REQUEST", "This operation needs a JSON body.");
  }
  if (error.type === "headers") {
    return new ApiError("INVALID_REQUEST", "A required header is missing or malformed.", {
      errors: collect(error, request),
    });
  }
  return ApiError.validation(collect(error, request));
}

function collect(error: ValidationError, request?: Request): FieldErrors {
  const errors = newFieldErrors();
  for (const issue of error.all) {
    if (!("path" in issue)) continue;
    const path =
      issue.path.replace(/^\//, "").replaceAll("/", ".") || queryFieldOf(error, issue, request) || error.type;
    const schema = "schema" in issue ? issue.schema : undefined;
    const choices = literalChoices(schema);
    const member = memberError(issue);
    const rule = ruleOf(schema);
    // TypeBox reports a missing member twice ("Property 'x' is missing", then "Expected property
    // 'x' to be string but found: undefined"); JSON has no undefined, so either means absent.
    const missing = "value" in issue && issue.value === undefined && issue.message !== "Unexpected property";
    const message = missing
      ? "is required"
      : issue.message === "Unexpected property"
        ? error.type === "query"
          ? "is not a known query parameter"
          : "is not a known field"
        : rule
          ? rule
          : member
            ? `${member}${choices?.includes("null") ? " (or null)" : ""}`
            : choices && choices.length === 1
              ? `must be ${choices[0] === "integer" ? "an integer" : choices[0]}`
              : choices
                ? `must be one of: ${choices.join(", ")}`
                : (issue.summary ?? issue.message);
    addFieldError(errors, path, message);
  }
  if (Object.keys(errors).length === 0) errors.body = ["does not match the schema"];
  return errors;
}

/**
 * Elysia checks coerced query values one by one and reports them without a path; the field is the
 * query parameter whose raw value is the one that failed.
 */
function queryFieldOf(
  error: ValidationError,
  issue: { value?: unknown },
  request?: Request,
): string | undefined {
  if ((error.type !== "query" && error.type !== "property") || !request || issue.value === undefined)
    return undefined;
  for (const [name, value] of new URL(request.url).searchParams) {
    if (value === String(issue.value)) return name;
  }
  return undefined;
}

/**
 * What a field's schema says its values must be (`x-rule`, see NameField), for the field itself or
 * for the non-null member of a nullable one: clearer than the pattern it breaks.
 */
function ruleOf(schema: unknown): string | undefined {
  const own = (schema as { "x-rule"?: unknown } | undefined)?.["x-rule"];
  if (typeof own === "string") return own;
  const anyOf = (schema as { anyOf?: { "x-rule"?: unknown }[] } | undefined)?.anyOf;
  const member = Array.isArray(anyOf) ? anyOf.find((m) => typeof m["x-rule"] === "string") : undefined;
  return typeof member?.["x-rule"] === "string" ? `${member["x-rule"]} (or null)` : undefined;
}

/**
 * For a union with one member of the given value's JSON type (a nullable field given a string, a
 * machine_info fact given a string too long), what that member found wrong ("Expected string
 * length less or equal to 256"), instead of "must be one of: string, integer, boolean", which
 * says nothing about a string that was refused; a nullable field given another type, what its
 * other member expects ("Expected string"). Enums (several string members) are left to the list
 * of choices.
 */
function memberError(issue: {
  value?: unknown;
  schema?: unknown;
  errors?: { First(): { message: string } | undefined }[];
}): string | undefined {
  const anyOf = (issue.schema as { anyOf?: { type?: unknown }[] } | undefined)?.anyOf;
  if (!Array.isArray(anyOf) || !issue.errors) return undefined;
  const types = jsonTypesOf(issue.value);
  let members = anyOf.flatMap((schema, index) => (types.includes(schema.type) ? [index] : []));
  // A nullable field given another type altogether: what its one other member expects.
  if (members.length === 0 && anyOf.length === 2 && issue.value !== null)
    members = anyOf.flatMap((schema, index) => (schema.type === "null" ? [] : [index]));
  if (members.length !== 1) return undefined;
  const message = issue.errors[members[0] as number]?.First()?.message;
  // A pattern's source (the email one is 200 characters of character classes) helps nobody.
  return message?.startsWith("Expected string to match '") ? "is not in the expected form" : message;
}

/** The JSON Schema types of a value's kind (a fraction is a number an integer member refused). */
function jsonTypesOf(value: unknown): unknown[] {
  if (value === null) return ["null"];
  if (Array.isArray(value)) return ["array"];
  if (typeof value === "number") return ["integer", "number"];
  return [typeof value];
}

/** For a union (our enums, nullable fields), what each member accepts, so the message can list them. */
function literalChoices(schema: unknown): string[] | undefined {
  const anyOf = (schema as { anyOf?: Record<string, unknown>[] } | undefined)?.anyOf;
  if (!Array.isArray(anyOf) || anyOf.length === 0) return undefined;
  const choices = anyOf.map((member) => {
    if (typeof member.const === "string") return member.const;
    if (member.format === "integer" || member.format === "numeric") return String(member.format);
    if (typeof member.format === "string") return `${member.format} string`;
    return String(member.type ?? "value");
  });
  return [...new Set(choices)];
}

export function errorBody(error: ApiError, requestId: string, baseUrl: string): ErrorEnvelope {
  return {
    error: {
      code: error.code,
      message: error.message,
      request_id: requestId,
      retryable: error.retryable,
      doc_url: `${baseUrl}/docs/errors#${error.code}`,
      details: error.details,
    },
  };
}
