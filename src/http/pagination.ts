import { timingSafeEqual } from "node:crypto";
import { t } from "elysia";
import { canonicalize } from "../crypto/jcs.ts";
import type { SecretBox } from "../crypto/secret-box.ts";
import { CROCKFORD_ALPHABET } from "../domain/base32.ts";
import type { Environment } from "../domain/scopes.ts";
import { ApiError } from "./errors.ts";

export const DEFAULT_PAGE_SIZE = 50;
const MAX_PAGE_SIZE = 200;

/**
 * `limit` and `cursor`, shared by every list. Elysia's `t.Integer` (not TypeBox's) because query
 * values arrive as strings and must be coerced before the range check. That coercion is `+value`,
 * which reads `0x10`, `1e1`, `+5` and ` 5` as numbers, and a repeated parameter becomes its last
 * value: `checkQuery` refuses both before the schema sees them (src/http/conventions.ts).
 */
export const pageParams = {
  limit: t.Optional(
    t.Integer({
      minimum: 1,
      maximum: MAX_PAGE_SIZE,
      description: `Page size in plain decimal digits, 1-${MAX_PAGE_SIZE} (default ${DEFAULT_PAGE_SIZE}).`,
    }),
  ),
  // No maxLength: a schema bound would answer 422, and every bad cursor, however long, is 400
  // (PageCursors.read checks the length first; the request line limit bounds what arrives).
  cursor: t.Optional(
    t.String({
      description:
        "Opaque cursor from `pagination.next_cursor` of the previous page of this listing, with the same filters.",
    }),
  ),
};

export const PageQuery = t.Object(pageParams);

const DIGITS = /^[0-9]+$/;

/**
 * A request's query as sent (`query` is the URL after its `?`): every parameter at most once, on
 * every route, else 400 INVALID_REQUEST: the router would keep the last of repeated ones, so
 * `?product_id=a&product_id=b` would list b's alone and `?period=previous_month&period=current_month`
 * report the current month, each looking like an answer about what was sent first. On a list
 * (`paged`), `limit` in plain decimal digits too, else 400 as a forged cursor is; a well-formed
 * `limit` outside 1..200 is a value out of range: 422 keyed `limit`.
 */
export function checkQuery(query: string, paged: boolean): void {
  const params = new URLSearchParams(query);
  for (const name of new Set(params.keys())) {
    const values = params.getAll(name);
    if (values.length > 1)
      throw new ApiError("INVALID_REQUEST", `${name} was sent more than once.`, { [name]: values });
  }
  if (!paged) return;
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

/** What a newest-first service list reads: only rows whose id sorts before `before`. */
export interface PageRequest {
  limit: number;
  before?: string;
}

/** What an oldest-first service list reads (runtime_events): only rows whose id sorts after `after`. */
export interface PageRequestAfter {
  limit: number;
  after?: string;
}

/**
 * The listing a cursor belongs to. A cursor is good only for the route, environment and filters
 * it was issued for: each is in its MAC, so a cursor of another listing, of the other
 * environment's key or of other filters, and any cursor the server did not make, is refused.
 */
export interface Listing {
  /** The route template (`/mgmt/v1/licenses/:id/activations`). */
  route: string;
  /** The prefix of the listed rows' ids (`act`). */
  idPrefix: string;
  environment: Environment;
  /** Path parameters and query filters, as sent; an absent filter is left out. */
  filters?: Readonly<Record<string, string | undefined>>;
}

type Direction = "before" | "after";
type PageQueryValues = { limit?: number; cursor?: string };

const FORMAT = 1;
const ID_BYTES = 16;
const TAG_BYTES = 16;
/** base64url of format (1) + id (16) + tag (16) bytes: 44 characters, no padding, no spare bits. */
const CURSOR_LENGTH = 44;
const CURSOR = /^[A-Za-z0-9_-]{44}$/;
const ID_BODY = /^[0-9A-HJKMNP-TV-Z]{26}$/;
const MAX_ID = 1n << 128n;

const notIssued = (cursor: string) =>
  new ApiError("INVALID_REQUEST", "The cursor is not one this listing issued.", { cursor });

/** A ULID's 26 Crockford characters as its 16 bytes (its top 2 bits are zero). */
function idBytes(id: string, prefix: string): Buffer {
  const body = id.slice(prefix.length + 1);
  if (!id.startsWith(`${prefix}_`) || !ID_BODY.test(body)) throw new Error(`not a ${prefix} id: ${id}`);
  let value = 0n;
  for (const char of body) value = value * 32n + BigInt(CROCKFORD_ALPHABET.indexOf(char));
  if (value >= MAX_ID) throw new Error(`not a ${prefix} id: ${id}`);
  return Buffer.from(value.toString(16).padStart(ID_BYTES * 2, "0"), "hex");
}

function idFrom(bytes: Uint8Array, prefix: string): string {
  let value = BigInt(`0x${Buffer.from(bytes).toString("hex")}`);
  let body = "";
  for (let i = 0; i < 26; i++) {
    body = CROCKFORD_ALPHABET[Number(value % 32n)] + body;
    value /= 32n;
  }
  return `${prefix}_${body}`;
}

/**
 * Pagination cursors (docs/api.md "Pagination"): base64url of a format byte, the 16 bytes of the
 * last id of the page, and a 128-bit HMAC under the keystore's data key (SecretBox.lookupHash)
 * over the listing, the direction and that id. 44 URL-safe characters, unforgeable, and bound to
 * the listing that issued them.
 */
export class PageCursors {
  constructor(private readonly secrets: Pick<SecretBox, "lookupHash">) {}

  /** Lists newest first: the next page holds the rows before the cursor's id. */
  newestFirst(query: PageQueryValues, listing: Listing): NewestFirstPage {
    const limit = query.limit ?? DEFAULT_PAGE_SIZE;
    const before = query.cursor === undefined ? undefined : this.read(query.cursor, listing, "before");
    return new NewestFirstPage(limit, before, (id) => this.issue(listing, "before", id));
  }

  /** Lists oldest first (runtime_events): the next page holds the rows after the cursor's id. */
  oldestFirst(query: PageQueryValues, listing: Listing): OldestFirstPage {
    const limit = query.limit ?? DEFAULT_PAGE_SIZE;
    const after = query.cursor === undefined ? undefined : this.read(query.cursor, listing, "after");
    return new OldestFirstPage(limit, after, (id) => this.issue(listing, "after", id));
  }

  /** The cursor this listing issues for a page ending at `id`. */
  issue(listing: Listing, direction: Direction, id: string): string {
    const bytes = Buffer.concat([
      Buffer.of(FORMAT),
      idBytes(id, listing.idPrefix),
      this.tag(listing, direction, id),
    ]);
    return bytes.toString("base64url");
  }

  private read(cursor: string, listing: Listing, direction: Direction): string {
    // The pattern refuses standard base64 (`+`, `/`, `=`) and any other length before decoding.
    if (cursor.length !== CURSOR_LENGTH || !CURSOR.test(cursor)) throw notIssued(cursor);
    const bytes = Buffer.from(cursor, "base64url");
    if (bytes[0] !== FORMAT) throw notIssued(cursor);
    const id = idFrom(bytes.subarray(1, 1 + ID_BYTES), listing.idPrefix);
    if (!timingSafeEqual(bytes.subarray(1 + ID_BYTES), this.tag(listing, direction, id)))
      throw notIssued(cursor);
    return id;
  }

  private tag(listing: Listing, direction: Direction, id: string): Buffer {
    const filters: Record<string, string> = {};
    for (const [name, value] of Object.entries(listing.filters ?? {}))
      if (value !== undefined) filters[name] = value;
    const signed = canonicalize({
      v: FORMAT,
      route: listing.route,
      environment: listing.environment,
      filters,
      direction,
      id,
    });
    return Buffer.from(this.secrets.lookupHash(signed, "pagination-cursor"), "hex").subarray(0, TAG_BYTES);
  }
}

/** One page of a list: its limit and position, and the next cursor once the rows are read. */
abstract class CursorPage {
  constructor(
    readonly limit: number,
    private readonly next: (lastId: string) => string,
  ) {}

  /** `rows` must hold up to limit + 1 items, fetched in list order; the extra one only signals "more". */
  split<T extends { id: string }>(rows: T[]) {
    const hasMore = rows.length > this.limit;
    const pageRows = hasMore ? rows.slice(0, this.limit) : rows;
    const last = pageRows.at(-1);
    return {
      rows: pageRows,
      pagination: { next_cursor: hasMore && last ? this.next(last.id) : null, has_more: hasMore },
    };
  }

  /** The list body: the page's rows presented, and its pagination. */
  present<T extends { id: string }, U>(rows: T[], present: (row: T) => U) {
    const page = this.split(rows);
    return { data: page.rows.map(present), pagination: page.pagination };
  }
}

export class NewestFirstPage extends CursorPage implements PageRequest {
  constructor(
    limit: number,
    readonly before: string | undefined,
    next: (lastId: string) => string,
  ) {
    super(limit, next);
  }
}

export class OldestFirstPage extends CursorPage implements PageRequestAfter {
  constructor(
    limit: number,
    readonly after: string | undefined,
    next: (lastId: string) => string,
  ) {
    super(limit, next);
  }
}
