import { ApiError } from "./errors.ts";

/** Route-specific byte limits; anything not listed gets the default. */
export const DEFAULT_BODY_LIMIT = 64 * 1024;

const BODYLESS = new Set(["GET", "HEAD", "OPTIONS"]);

/**
 * Reads and parses a JSON body under a byte limit. Empty bodies parse to `undefined`; the route's
 * schema then decides whether a body was required.
 */
export async function parseJsonBody(request: Request, limit = DEFAULT_BODY_LIMIT): Promise<unknown> {
  if (BODYLESS.has(request.method)) return undefined;
  const declared = request.headers.get("content-length");
  if (declared !== null && Number(declared) > limit) throw tooLarge(limit);
  const bytes = new Uint8Array(await request.arrayBuffer());
  if (bytes.byteLength > limit) throw tooLarge(limit);
  if (bytes.byteLength === 0) return undefined;
  const contentType = request.headers.get("content-type") ?? "";
  const mediaType = contentType.split(";")[0]?.trim().toLowerCase();
  if (mediaType !== "application/json") {
    throw new ApiError(
      "INVALID_REQUEST",
      "The body must be JSON, sent with Content-Type: application/json.",
      {
        content_type: contentType || null,
      },
    );
  }
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new ApiError("INVALID_REQUEST", "The body is not valid UTF-8.");
  }
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new ApiError("INVALID_REQUEST", "The body is not well-formed JSON.", {
      parse_error: error instanceof Error ? error.message : String(error),
    });
  }
}

const tooLarge = (limit: number) =>
  new ApiError("PAYLOAD_TOO_LARGE", `The request body is larger than this route accepts (${limit} bytes).`, {
    limit_bytes: limit,
  });
