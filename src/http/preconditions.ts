import { sha256Hex } from "../crypto/encoding.ts";
import { ApiError } from "./errors.ts";

/**
 * A parsed If-Match header (RFC 9110 §13.1.1): `*`, or the strong entity-tags it lists. Weak tags
 * are well-formed but never match (If-Match uses the strong comparison), so they are dropped here:
 * a header of weak tags only matches nothing.
 */
export type IfMatch = { readonly any: true } | { readonly any: false; readonly strong: readonly string[] };

/** etagc = %x21 / %x23-7E / obs-text: any visible character but DQUOTE, no space or control. */
const ETAGC = /^[\x21\x23-\x7E\x80-\xFF]*$/;
/**
 * Products and licenses also take their bare `version` (`7` for `"7"`), alone (docs/api.md). Any
 * route reads it so: on a resource with an opaque ETag, or none, it is a stale tag (409), as the
 * quoted form is, not a malformed header (test/api/policies.test.ts).
 */
const BARE_VERSION = /^\d{1,15}$/;
const isOws = (c: string | undefined) => c === " " || c === "\t";
/**
 * The longest If-Match header read (the route schemas say the same, IfMatchHeaders): a real one is
 * a few tags long; a longer one is refused before it is parsed, so no header costs more than this.
 */
export const IF_MATCH_MAX_LENGTH = 1024;

/** The header without the spaces and tabs around it: one pass from each end, linear in its length. */
function trimOws(header: string): string {
  let start = 0;
  let end = header.length;
  while (start < end && isOws(header[start])) start++;
  while (end > start && isOws(header[end - 1])) end--;
  return header.slice(start, end);
}

const malformed = (header: string) =>
  new ApiError(
    "INVALID_REQUEST",
    'If-Match must be * or a comma-separated list of entity-tags such as "7" (RFC 9110 §13.1.1).',
    { if_match: header },
  );

/**
 * The one If-Match parser of every route. Undefined when the header is absent (the change is
 * unconditional); 400 when it is not `*`, a bare version, or a list of entity-tags (an unbalanced
 * quote, `*` inside a list, a tag without quotes, an empty header).
 */
export function parseIfMatch(header: string | undefined | null): IfMatch | undefined {
  if (header === undefined || header === null) return undefined;
  if (header.length > IF_MATCH_MAX_LENGTH) {
    throw new ApiError("INVALID_REQUEST", `If-Match is longer than ${IF_MATCH_MAX_LENGTH} characters.`, {
      if_match_length: header.length,
    });
  }
  const value = trimOws(header);
  if (value === "*") return { any: true };
  if (BARE_VERSION.test(value)) return { any: false, strong: [`"${value}"`] };
  const strong: string[] = [];
  let tags = 0;
  let i = 0;
  while (i < value.length) {
    // Empty list elements and the spaces around commas are allowed (RFC 9110 §5.6.1).
    if (isOws(value[i]) || value[i] === ",") {
      i++;
      continue;
    }
    const weak = value.startsWith('W/"', i);
    if (weak) i += 2;
    if (value[i] !== '"') throw malformed(header);
    const close = value.indexOf('"', i + 1);
    if (close < 0) throw malformed(header);
    const opaque = value.slice(i + 1, close);
    if (!ETAGC.test(opaque)) throw malformed(header);
    tags++;
    if (!weak) strong.push(`"${opaque}"`);
    i = close + 1;
    while (isOws(value[i])) i++;
    if (i < value.length && value[i] !== ",") throw malformed(header);
  }
  if (tags === 0) throw malformed(header);
  return { any: false, strong };
}

/**
 * Throws 409 VERSION_CONFLICT unless the precondition holds for the resource's current ETag:
 * no If-Match, `*`, or a strong tag equal to it, character for character.
 */
export function assertIfMatch(ifMatch: IfMatch | undefined, current: string): void {
  if (ifMatch === undefined || ifMatch.any) return;
  if (!ifMatch.strong.includes(current)) throw versionConflict(current);
}

/**
 * For a route whose resource has no ETag (a device block, a license assignment, an activation):
 * no entity-tag can equal its current one, so any If-Match but `*` is false (RFC 9110 §13.1.1)
 * and the change must not happen: 409 VERSION_CONFLICT, as a stale tag answers elsewhere, with
 * `current_etag: null`. Without If-Match, or with `*`, the change goes on.
 */
export function assertIfMatchWithoutEtag(ifMatch: IfMatch | undefined): void {
  if (ifMatch === undefined || ifMatch.any) return;
  throw new ApiError(
    "VERSION_CONFLICT",
    "This resource has no ETag, so no entity-tag matches it (only If-Match: * does); nothing was changed.",
    { current_etag: null },
  );
}

export const versionEtag = (version: number): string => `"${version}"`;

/**
 * Policies, customers, license users, webhooks and resellers: an opaque ETag derived from the id
 * and an internal revision, so a client cannot mistake a display number for a concurrency token.
 */
export const opaqueEtag = (id: string, revision: number): string =>
  `"${sha256Hex(`${id}:${revision}`).slice(0, 24)}"`;

export function versionConflict(current: string): ApiError {
  return new ApiError("VERSION_CONFLICT", "The resource changed since you read it; nothing was changed.", {
    current_etag: current,
  });
}
