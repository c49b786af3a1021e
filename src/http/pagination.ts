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

/**
 * Cursors are base64url JSON naming the last id of the previous page: `{"before": id}` for the
 * newest-first lists, `{"after": id}` for the oldest-first ones. The id must have the listing's
 * prefix, so a cursor from another listing is refused.
 */
type Direction = "before" | "after";

function decodeCursor(cursor: string, direction: Direction, idPrefix: string): string {
  let id: unknown;
  try {
    id = (JSON.parse(Buffer.from(cursor, "base64url").toString("utf8")) as Record<string, unknown>)[
      direction
    ];
  } catch {
    id = undefined;
  }
  if (typeof id !== "string" || !id.startsWith(`${idPrefix}_`) || id.length > 64) {
    throw new ApiError("INVALID_REQUEST", "The cursor is not one this listing issued.", { cursor });
  }
  return id;
}

function split<T extends { id: string }>(rows: T[], limit: number, direction: Direction) {
  const hasMore = rows.length > limit;
  const pageRows = hasMore ? rows.slice(0, limit) : rows;
  const last = pageRows.at(-1);
  const next =
    hasMore && last ? Buffer.from(JSON.stringify({ [direction]: last.id })).toString("base64url") : null;
  return { rows: pageRows, pagination: { next_cursor: next, has_more: hasMore } };
}

export function pageRequest(query: { limit?: number; cursor?: string }, idPrefix: string): PageRequest {
  const limit = query.limit ?? DEFAULT_PAGE_SIZE;
  return query.cursor === undefined
    ? { limit }
    : { limit, before: decodeCursor(query.cursor, "before", idPrefix) };
}

/** For oldest-first lists (runtime_events). */
export function pageRequestAfter(
  query: { limit?: number; cursor?: string },
  idPrefix: string,
): { limit: number; after?: string } {
  const limit = query.limit ?? DEFAULT_PAGE_SIZE;
  return query.cursor === undefined
    ? { limit }
    : { limit, after: decodeCursor(query.cursor, "after", idPrefix) };
}

/** `rows` must hold up to limit + 1 items, fetched in list order; the extra one only signals "more". */
export const splitPage = <T extends { id: string }>(rows: T[], limit: number) => split(rows, limit, "before");
export const splitPageAfter = <T extends { id: string }>(rows: T[], limit: number) =>
  split(rows, limit, "after");

export function toPage<T extends { id: string }, U>(rows: T[], limit: number, present: (row: T) => U) {
  const page = splitPage(rows, limit);
  return { data: page.rows.map(present), pagination: page.pagination };
}
