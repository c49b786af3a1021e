import { Type } from "@sinclair/typebox";
import { ApiError } from "./errors.ts";

export const DEFAULT_PAGE_SIZE = 50;

export const PageQuery = Type.Object({
  limit: Type.Optional(
    Type.Integer({ minimum: 1, maximum: 200, description: "Page size, 1-200 (default 50)." }),
  ),
  cursor: Type.Optional(
    Type.String({
      maxLength: 512,
      description: "Opaque cursor from `pagination.next_cursor` of the previous page.",
    }),
  ),
});

export const Pagination = Type.Object(
  {
    next_cursor: Type.Union([Type.String(), Type.Null()], {
      description: "Pass as `cursor` to get the next page; null on the last page.",
    }),
    has_more: Type.Boolean(),
  },
  { $id: "#/components/schemas/Pagination" },
);

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

/** `rows` must hold up to limit + 1 items, fetched newest first. */
export function toPage<T extends { id: string }, U>(rows: T[], limit: number, present: (row: T) => U) {
  const hasMore = rows.length > limit;
  const pageRows = hasMore ? rows.slice(0, limit) : rows;
  const last = pageRows.at(-1);
  return {
    data: pageRows.map(present),
    pagination: {
      next_cursor:
        hasMore && last ? Buffer.from(JSON.stringify({ before: last.id })).toString("base64url") : null,
      has_more: hasMore,
    },
  };
}
