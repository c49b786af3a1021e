import { t } from "elysia";
import { ApiError } from "./errors.ts";

export const DEFAULT_PAGE_SIZE = 50;

/**
 * `limit` and `cursor`, shared by every list. Elysia's `t.Integer` (not TypeBox's) because query
 * values arrive as strings and must be coerced before the range check.
 */
export const pageParams = {
  limit: t.Optional(t.Integer({ minimum: 1, maximum: 200, description: "Page size, 1-200 (default 50)." })),
  cursor: t.Optional(
    t.String({
      maxLength: 512,
      description: "Opaque cursor from `pagination.next_cursor` of the previous page.",
    }),
  ),
};

export const PageQuery = t.Object(pageParams);

export interface PageRequest {
  limit: number;
  /** Only rows whose id sorts before this one (lists are newest first). */
  before?: string;
}

/** The cursor is base64url JSON `{"before": "<id>"}`; its id must have the listing's prefix. */
export function pageRequest(query: { limit?: number; cursor?: string }, idPrefix: string): PageRequest {
  const limit = query.limit ?? DEFAULT_PAGE_SIZE;
  if (query.cursor === undefined) return { limit };
  let before: unknown;
  try {
    before = (JSON.parse(Buffer.from(query.cursor, "base64url").toString("utf8")) as { before?: unknown })
      .before;
  } catch {
    before = undefined;
  }
  if (typeof before !== "string" || !before.startsWith(`${idPrefix}_`) || before.length > 64) {
    throw new ApiError("INVALID_REQUEST", "The cursor is not one this listing issued.", {
      cursor: query.cursor,
    });
  }
  return { limit, before };
}

/** `rows` must hold up to limit + 1 items, fetched newest first; the extra one only signals "more". */
export function splitPage<T extends { id: string }>(rows: T[], limit: number) {
  const hasMore = rows.length > limit;
  const pageRows = hasMore ? rows.slice(0, limit) : rows;
  const last = pageRows.at(-1);
  return {
    rows: pageRows,
    pagination: {
      next_cursor:
        hasMore && last ? Buffer.from(JSON.stringify({ before: last.id })).toString("base64url") : null,
      has_more: hasMore,
    },
  };
}

export function toPage<T extends { id: string }, U>(rows: T[], limit: number, present: (row: T) => U) {
  const page = splitPage(rows, limit);
  return { data: page.rows.map(present), pagination: page.pagination };
}

/** For oldest-first lists (runtime_events): the cursor carries the last id seen, `{"after": id}`. */
export function pageRequestAfter(
  query: { limit?: number; cursor?: string },
  idPrefix: string,
): { limit: number; after?: string } {
  const limit = query.limit ?? DEFAULT_PAGE_SIZE;
  if (query.cursor === undefined) return { limit };
  let after: unknown;
  try {
    after = (JSON.parse(Buffer.from(query.cursor, "base64url").toString("utf8")) as { after?: unknown })
      .after;
  } catch {
    after = undefined;
  }
  if (typeof after !== "string" || !after.startsWith(`${idPrefix}_`) || after.length > 64) {
    throw new ApiError("INVALID_REQUEST", "The cursor is not one this listing issued.", {
      cursor: query.cursor,
    });
  }
  return { limit, after };
}

export function splitPageAfter<T extends { id: string }>(rows: T[], limit: number) {
  const hasMore = rows.length > limit;
  const pageRows = hasMore ? rows.slice(0, limit) : rows;
  const last = pageRows.at(-1);
  return {
    rows: pageRows,
    pagination: {
      next_cursor:
        hasMore && last ? Buffer.from(JSON.stringify({ after: last.id })).toString("base64url") : null,
      has_more: hasMore,
    },
  };
}
