import { sha256Hex } from "../crypto/encoding.ts";
import { ApiError } from "./errors.ts";

/**
 * If-Match for products and licenses: their `version`, bare or quoted (`7` or `"7"`).
 * Undefined when the header is absent (the change is unconditional).
 */
export function versionFromIfMatch(header: string | undefined | null): number | undefined {
  // `*` matches whatever version exists: the change is as unconditional as without the header.
  if (header === undefined || header === null || header.trim() === "*") return undefined;
  const match = /^\s*(?:W\/)?"?(\d{1,15})"?\s*$/.exec(header);
  if (!match?.[1]) {
    throw new ApiError("INVALID_REQUEST", 'If-Match must be the resource version, e.g. 7 or "7".', {
      if_match: header,
    });
  }
  return Number(match[1]);
}

export const versionEtag = (version: number): string => `"${version}"`;

/**
 * Policies and customers: an opaque ETag derived from the id and an internal revision, so a
 * client cannot mistake the policy's display `version` for a concurrency token.
 */
export const opaqueEtag = (id: string, revision: number): string =>
  `"${sha256Hex(`${id}:${revision}`).slice(0, 24)}"`;

/** True when there is no If-Match, it is `*`, or one of its listed tags is the current one. */
export function ifMatchAccepts(header: string | undefined | null, current: string): boolean {
  if (header === undefined || header === null) return true;
  const tags = header.split(",").map((tag) => tag.trim());
  return tags.some((tag) => tag === "*" || tag === current);
}

export function versionConflict(current: string): ApiError {
  return new ApiError("VERSION_CONFLICT", "The resource changed since you read it; nothing was changed.", {
    current_etag: current,
  });
}
