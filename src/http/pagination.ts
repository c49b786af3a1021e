import { t } from "elysia";
import { ApiError } from "./errors.ts";

export const DEFAULT_PAGE_SIZE = 50;
const MAX_PAGE_SIZE = 200;

/**
 * `limit` and `cursor`, shared by every list. Elysia's `t.Integer` (not TypeBox's) because query
 * values arrive as strings and must be coerced before the range check. That coercion is `+value`,
 * which reads `0x10`, `1e1`, `+5` and ` 5` as numbers, and a repeated parameter becomes its last
 * value: `checkPageQuery` refuses both before the schema sees them (src/http/conventions.ts).
 */
export const pageParams = {
  limit: t.Optional(
    t.Integer({
      minimum: 1,
      maximum: MAX_PAGE_SIZE,
      description: `Page size in plain decimal digits, 1-${MAX_PAGE_SIZE} (default ${DEFAULT_PAGE_SIZE}).`,
    }),
  ),
  cursor: t.Optional(
    t.String({
      maxLength: 512,
      description: "Opaque cursor from `pagination.next_cursor` of the previous page.",
    }),
  ),
};

export const PageQuery = t.Object(pageParams);

const DIGITS = /^[0-9]+$/;

/**
 * The paging parameters as sent (`url` is the request URL): `limit` and `cursor` at most once
 * each, and `limit` in plain decimal digits, else 400 INVALID_REQUEST as a forged cursor is. A
 * well-formed `limit` outside 1..200 is a value out of range: 422 keyed `limit`.
 */
export function checkPageQuery(url: string): void {
  const at = url.indexOf("?");
  if (at === -1) return;
  const params = new URLSearchParams(url.slice(at + 1));
  for (const name of ["limit", "cursor"]) {
    const values = params.getAll(name);
    if (values.length > 1)
      throw new ApiError("INVALID_REQUEST", `${name} was sent more than once.`, { [name]: values });
  }
  const limit = params.get("limit");
  if (limit === null) return;
  if (!DIGITS.test(limit)) {
    throw new ApiError("INVALID_REQUEST", "limit must be a whole number in plain decimal digits.", { limit });
  }
  const size = Number(limit);
  if (size < 1 || size > MAX_PAGE_SIZE)
    throw ApiError.validation({ limit: [`must be between 1 and ${MAX_PAGE_SIZE}`] });
}

/** The routes (method and path pattern) whose query takes `limit`, from their schemas. */
export function pagedRoutes(routes: readonly { method: string; path: string; hooks: unknown }[]) {
  const paged = new Set<string>();
  for (const route of routes) {
    const query = (route.hooks as { query?: { properties?: Record<string, unknown> } } | undefined)?.query;
    if (query?.properties && "limit" in query.properties) paged.add(`${route.method} ${route.path}`);
  }
  return (method: string, route: string) => paged.has(`${method} ${route}`);
}

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
