import { UNKNOWN_ADDRESS } from "./client-address.ts";
import { ApiError } from "./errors.ts";

/** Management bodies; runtime routes are smaller (see bodyLimitFor). */
export const DEFAULT_BODY_LIMIT = 64 * 1024;
/** Runtime bodies are a device's few fields: machine info, signals, a proof. */
export const RUNTIME_BODY_LIMIT = 16 * 1024;
/**
 * Billing-provider webhooks carry whole objects (an invoice with its lines, a checkout session
 * with its items and metadata), which can pass 64 KiB; one refused for its size would be refused
 * on every retry until the provider gives up. Stripe states no maximum: 1 MiB is far beyond its
 * events and still cheap to read and verify.
 */
export const BILLING_WEBHOOK_BODY_LIMIT = 1024 * 1024;
/** Where the provider posts events; one address for both modes (the signing secret tells them apart). */
export const BILLING_WEBHOOK_PATH = "/billing/v1/stripe/webhook";

/** The exact path (a trailing slash is the same route to the router), nothing under it. */
export const isBillingWebhookPath = (path: string): boolean =>
  path === BILLING_WEBHOOK_PATH || path === `${BILLING_WEBHOOK_PATH}/`;

export const bodyLimitFor = (path: string): number => {
  if (path.startsWith("/runtime/")) return RUNTIME_BODY_LIMIT;
  if (isBillingWebhookPath(path)) return BILLING_WEBHOOK_BODY_LIMIT;
  return DEFAULT_BODY_LIMIT;
};

/**
 * How many bodies over the management limit (the webhook's, up to 1 MiB each) may be read at
 * once. A client that sends a large body's headers and stalls holds its buffer until the idle
 * timeout; without a bound, a few thousand such connections pinned gigabytes. Past it the answer is
 * 503 with Retry-After, which the provider retries. A slot is taken by the body's size, not its
 * route: only a body declaring more than DEFAULT_BODY_LIMIT (or, sent chunked, that has passed it
 * as received) needs one, so the provider's real events, almost all far smaller, never wait for
 * one; and one client address holds at most LARGE_BODY_SLOTS_PER_ADDRESS of them, so a few
 * stalled connections from one place cannot take them all.
 */
export const LARGE_BODY_SLOTS = 32;
/** The large-body slots one client address (an IPv6 /64, see addressPartition) may hold at once. */
export const LARGE_BODY_SLOTS_PER_ADDRESS = 4;
let largeBodiesInFlight = 0;
const largeBodiesByAddress = new Map<string, number>();

/** Takes a large-body slot for a client, or refuses with 503; returns the slot's release (idempotent). */
function takeLargeBodySlot(address: string): () => void {
  const held = largeBodiesByAddress.get(address) ?? 0;
  if (largeBodiesInFlight >= LARGE_BODY_SLOTS || held >= LARGE_BODY_SLOTS_PER_ADDRESS) {
    const fromAddress = held >= LARGE_BODY_SLOTS_PER_ADDRESS;
    throw new ApiError(
      "SERVICE_UNAVAILABLE",
      fromAddress
        ? "Too many large request bodies are being received from this address; try again shortly."
        : "Too many large request bodies are being received; try again shortly.",
      { reason: fromAddress ? "large_bodies_from_address" : "large_bodies_in_flight" },
      { headers: { "retry-after": "1" } },
    );
  }
  largeBodiesInFlight++;
  largeBodiesByAddress.set(address, held + 1);
  let released = false;
  return () => {
    if (released) return;
    released = true;
    largeBodiesInFlight--;
    const left = (largeBodiesByAddress.get(address) ?? 1) - 1;
    if (left > 0) largeBodiesByAddress.set(address, left);
    else largeBodiesByAddress.delete(address);
  };
}

const BODYLESS = new Set(["GET", "HEAD", "OPTIONS"]);

/**
 * Which strings a body may hold. `strict` (every route of ours): no lone surrogates, no NUL.
 * `provider` (the billing provider's signed events): any, since a paid purchase must not be refused
 * on every retry over a character in a field we never read; the event reader checks each string
 * it takes (billing/stripe.ts `str`) and cleans the buyer's name.
 */
export type TextRule = "strict" | "provider";

export const textRuleFor = (path: string): TextRule => (isBillingWebhookPath(path) ? "provider" : "strict");

/**
 * Reads and parses a JSON body under a byte limit. Empty bodies parse to `undefined`; the route's
 * schema then decides whether a body was required.
 */
export async function parseJsonBody(
  request: Request,
  limit = DEFAULT_BODY_LIMIT,
  keepRaw: (bytes: Uint8Array) => void = () => {},
  textRule: TextRule = "strict",
  /** The client's address (its rate-limit partition), asked only when a large body needs a slot. */
  clientOf: () => string = () => UNKNOWN_ADDRESS,
): Promise<unknown> {
  if (BODYLESS.has(request.method)) return undefined;
  const declared = request.headers.get("content-length");
  if (declared !== null && Number(declared) > limit) throw tooLarge(limit);
  let release: (() => void) | undefined;
  const takeSlot = () => {
    release = takeLargeBodySlot(clientOf());
  };
  let bytes: Uint8Array;
  try {
    // A declared length (checked above) bounds what the server reads, so the body is read whole in
    // one native call; only a body without one (chunked) is read piece by piece under the limit,
    // taking its slot once what came passes the management limit.
    // The stream reader costs a promise per chunk: measurable on every heartbeat.
    if (declared !== null) {
      if (Number(declared) > DEFAULT_BODY_LIMIT) takeSlot();
      bytes = await readDeclared(request, limit);
    } else {
      bytes = await readLimited(request, limit, limit > DEFAULT_BODY_LIMIT ? takeSlot : undefined);
    }
  } finally {
    release?.();
  }
  keepRaw(bytes);
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
  return parseJsonBytes(bytes, "", textRule);
}

/**
 * A JSON body's bytes to its value, with the checks every body passes: UTF-8, well-formed JSON,
 * no repeated member names, depth, finite numbers, no lone surrogates or NUL characters. The
 * command line runs its request files through this too, so they are refused as the API would.
 * `at` is where the value sits in the body, for the paths of field errors (`request` for the
 * offline request file, which the route takes as the body's `request` member).
 */
export function parseJsonBytes(bytes: Uint8Array, at = "", textRule: TextRule = "strict"): unknown {
  let text: string;
  try {
    text = UTF8.decode(bytes);
  } catch {
    throw new ApiError("INVALID_REQUEST", "The body is not valid UTF-8.");
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new ApiError("INVALID_REQUEST", "The body is not well-formed JSON.", {
      parse_error: error instanceof Error ? error.message : String(error),
    });
  }
  const problem = inspect(parsed, text, at, textRule === "strict");
  if (problem?.kind === "duplicate") {
    throw new ApiError(
      "INVALID_REQUEST",
      "The body names one member twice in an object; I-JSON (RFC 7493) forbids it.",
    );
  }
  if (problem?.kind === "depth") {
    throw new ApiError("INVALID_REQUEST", `The body nests deeper than ${MAX_DEPTH} levels.`, {
      max_depth: MAX_DEPTH,
    });
  }
  if (problem?.kind === "number") {
    throw ApiError.validation({ [problem.path]: ["must be a finite number (I-JSON)"] });
  }
  if (problem?.kind === "unicode") {
    throw ApiError.validation({
      [problem.path]: ["must be valid Unicode text (no lone surrogates, I-JSON; no NUL characters)"],
    });
  }
  return parsed;
}

/** Stateless (no `stream` option), so one decoder serves every request. */
const UTF8 = new TextDecoder("utf-8", { fatal: true });

/** Far beyond any real payload; stops recursive work later (canonical JSON, storage) from blowing the stack. */
export const MAX_DEPTH = 32;

type Problem = { kind: "depth" | "duplicate" } | { kind: "number" | "unicode"; path: string };

/** A value met on the walk, with the way back to the root, so a path is spelt only for a problem. */
interface Visit {
  value: unknown;
  depth: number;
  parent: Visit | null;
  /** The member name, or the index in an array (turned into text only for a problem's path). */
  key: string | number;
}

const pathOf = (visit: Visit | null, root: string): string => {
  const keys: string[] = [];
  for (let at = visit; at?.parent; at = at.parent) keys.push(String(at.key));
  if (root) keys.push(root);
  return keys.reverse().join(".") || "body";
};

/**
 * One walk over a parsed body, iterative so it cannot overflow the stack itself. It finds depth
 * beyond MAX_DEPTH, a number JSON.parse turned into ±Infinity (`1e400`), or a string with a lone
 * surrogate: each would break later work (canonical JSON, signatures, storage).
 *
 * On the way it defuses objects like `{"name": {"toString": null}}`, which cannot be turned into
 * a string: their own `toString` shadows the inherited one. Schema error messages interpolate the
 * offending value (Elysia's do), and would throw instead of reporting a 422. Such objects get a
 * hidden `Symbol.toPrimitive`, invisible to JSON, key listing and validation, so they print as any
 * other object; the fields themselves stay, and are refused as unknown or mistyped like any other.
 */
function inspect(body: unknown, text: string, root: string, strictText: boolean): Problem | null {
  // A value that is a member of the body (the request file) starts one level down, as in the body.
  const top: Visit = { value: body, depth: root ? 2 : 1, parent: null, key: "" };
  const leaf = leafProblem(body, strictText);
  if (leaf) return problemAt(leaf, top, root);
  // Only objects and arrays are visited; their primitive members are checked where they stand,
  // so a body of half a million numbers costs a loop, not half a million visits.
  const stack: Visit[] = typeof body === "object" && body !== null ? [top] : [];
  let members = 0;
  while (stack.length > 0) {
    const visit = stack.pop() as Visit;
    const node = visit.value as object;
    if (visit.depth > MAX_DEPTH) return { kind: "depth" };
    if (Array.isArray(node)) {
      for (let i = 0; i < node.length; i++) {
        const item: unknown = node[i];
        if (typeof item === "object" && item !== null) {
          // An empty array holds nothing to check but its depth.
          if (!Array.isArray(item) || item.length > 0)
            stack.push({ value: item, depth: visit.depth + 1, parent: visit, key: i });
          else if (visit.depth + 1 > MAX_DEPTH) return { kind: "depth" };
          continue;
        }
        const problem = leafProblem(item, strictText);
        if (problem) return problemAt(problem, { value: item, depth: 0, parent: visit, key: i }, root);
      }
      continue;
    }
    if (Object.hasOwn(node, "toString") || Object.hasOwn(node, "valueOf")) {
      Object.defineProperty(node, Symbol.toPrimitive, { value: () => "[object Object]", enumerable: false });
    }
    const record = node as Record<string, unknown>;
    for (const key in record) {
      if (strictText && !wellFormedText(key)) return { kind: "unicode", path: pathOf(visit, root) };
      members++;
      const value = record[key];
      if (typeof value === "object" && value !== null) {
        stack.push({ value, depth: visit.depth + 1, parent: visit, key });
        continue;
      }
      const problem = leafProblem(value, strictText);
      if (problem) return problemAt(problem, { value, depth: 0, parent: visit, key }, root);
    }
  }
  // JSON.parse keeps the last of repeated names, so a body with them reads one way here and may
  // read another way to a proxy or another language's parser (which one did the device sign?).
  return memberSeparators(text) === members ? null : { kind: "duplicate" };
}

/**
 * What is wrong with a primitive value, if anything: a number JSON.parse turned into ±Infinity,
 * a lone surrogate (it cannot be encoded as UTF-8, so no two parties could agree on its JCS form)
 * or a NUL (it ends the text early for every C-string consumer: logs, exports, terminals, drivers).
 */
function leafProblem(value: unknown, strictText: boolean): "number" | "unicode" | null {
  if (typeof value === "number") return Number.isFinite(value) ? null : "number";
  if (typeof value === "string" && strictText) return wellFormedText(value) ? null : "unicode";
  return null;
}

/** Text every party reads alike: encodable as UTF-8 (no lone surrogate) and without a NUL. */
export const wellFormedText = (text: string): boolean => text.isWellFormed() && !text.includes("\0");

const problemAt = (kind: "number" | "unicode", visit: Visit, root: string): Problem => ({
  kind,
  path: pathOf(visit, root),
});

/**
 * The colons outside strings of well-formed JSON: exactly one per object member as written, so
 * more than the parsed objects hold means a name was repeated. One pass, no allocation.
 */
function memberSeparators(text: string): number {
  let count = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x3a) count++;
    else if (c === 0x22) {
      // Skip the string: a backslash escapes the next character, whatever it is.
      for (i++; i < text.length; i++) {
        const d = text.charCodeAt(i);
        if (d === 0x5c) i++;
        else if (d === 0x22) break;
      }
    }
  }
  return count;
}

/** A body whose Content-Length was within the limit; the length is checked again, as read. */
async function readDeclared(request: Request, limit: number): Promise<Uint8Array> {
  const bytes = new Uint8Array(await request.arrayBuffer());
  if (bytes.byteLength > limit) throw tooLarge(limit);
  return bytes;
}

/**
 * The most pieces a body without Content-Length may come in. Each costs a read of the stream on
 * the request thread (about 1.3 µs): a 1 MiB body sent one byte per chunk held every other request
 * up for over a second. Real clients send chunks of kilobytes.
 */
export const MAX_BODY_PIECES = 1024;

/**
 * Reads at most `limit` bytes, so a chunked upload without Content-Length cannot fill memory;
 * `pastDefaultLimit` is called once, as what came passes DEFAULT_BODY_LIMIT (it may refuse).
 */
async function readLimited(
  request: Request,
  limit: number,
  pastDefaultLimit?: () => void,
): Promise<Uint8Array> {
  if (!request.body) return new Uint8Array(0);
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const before = total;
    total += value.byteLength;
    if (total > limit) {
      await reader.cancel();
      throw tooLarge(limit);
    }
    if (pastDefaultLimit && before <= DEFAULT_BODY_LIMIT && total > DEFAULT_BODY_LIMIT) {
      try {
        pastDefaultLimit();
      } catch (error) {
        await reader.cancel();
        throw error;
      }
    }
    chunks.push(value);
    if (chunks.length > MAX_BODY_PIECES) {
      await reader.cancel();
      throw new ApiError(
        "INVALID_REQUEST",
        `The body came in more than ${MAX_BODY_PIECES} pieces: send it with Content-Length, or in larger chunks.`,
        { max_pieces: MAX_BODY_PIECES },
      );
    }
  }
  const bytes = new Uint8Array(total);
  let offset = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return bytes;
}

export const tooLarge = (limit: number) =>
  new ApiError("PAYLOAD_TOO_LARGE", `The request body is larger than this route accepts (${limit} bytes).`, {
    limit_bytes: limit,
  });

/**
 * The management routes (method and path pattern) that take a body by their method but have no
 * body schema: actions such as DELETE or `.../unlock`. Unknown fields are refused, not dropped
 * (DESIGN §2), and on these routes every field is unknown, so a caller who sends
 * `{"reason": "..."}` is told it was not kept instead of believing it was. Runtime routes are left
 * out: the protocol lets a device send any JSON body to a body-less route (its raw bytes are what
 * its proof hashes, docs/protocol.md), and clients we do not control rely on that.
 */
export function bodylessRoutes(routes: readonly { method: string; path: string; hooks: unknown }[]) {
  const bodyless = new Set<string>();
  for (const route of routes) {
    if (BODYLESS.has(route.method) || !route.path.startsWith("/mgmt/")) continue;
    if ((route.hooks as { body?: unknown } | undefined)?.body === undefined)
      bodyless.add(`${route.method} ${route.path}`);
  }
  return (method: string, route: string) => bodyless.has(`${method} ${route}`);
}

/** What a body-less route accepts: no body, or `{}` (which many clients send on every POST). */
export function refuseUnexpectedBody(body: unknown): unknown {
  if (body === undefined) return body;
  if (typeof body !== "object" || body === null || Array.isArray(body))
    throw ApiError.validation({ body: ["this operation takes no body: send none, or {}"] });
  const fields = Object.keys(body);
  if (fields.length > 0)
    throw ApiError.validation(Object.fromEntries(fields.map((field) => [field, ["is not a known field"]])));
  return body;
}
