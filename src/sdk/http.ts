/**
 * The HTTP layer: one request, JSON parsing, and turning unsigned error responses into SdkError.
 * `fetch` is injected; anything shaped like the Fetch API works.
 */
import { SdkError, type ServerErrorBody } from "./errors.ts";
import { isRecord, isString } from "./util.ts";

export interface ResponseLike {
  status: number;
  headers: { get(name: string): string | null };
  text(): Promise<string>;
}

export interface RequestInitLike {
  method: string;
  headers: Record<string, string>;
  body?: string;
}

export type FetchLike = (url: string, init: RequestInitLike) => Promise<ResponseLike>;

export interface HttpResult {
  status: number;
  headers: ResponseLike["headers"];
  /** Parsed JSON body; undefined when the body is empty or not JSON. */
  body: unknown;
  /** True when a non-empty body failed to parse. */
  malformed: boolean;
}

export async function send(fetchImpl: FetchLike, url: string, init: RequestInitLike): Promise<HttpResult> {
  let res: ResponseLike;
  let text: string;
  try {
    res = await fetchImpl(url, init);
    text = await res.text();
  } catch (cause) {
    throw new SdkError("NETWORK_ERROR", `request to ${url} failed`, {
      kind: "network",
      retryable: true,
      cause,
      details: { reason: cause instanceof Error ? cause.message : String(cause) },
    });
  }
  let body: unknown;
  let malformed = false;
  if (text.length > 0) {
    try {
      body = JSON.parse(text);
    } catch {
      malformed = true;
    }
  }
  return { status: res.status, headers: res.headers, body, malformed };
}

/** Retry-After as delta-seconds or an HTTP-date, in ms from `nowMs`; undefined when absent/bad. */
export function parseRetryAfter(value: string | null, nowMs: number): number | undefined {
  if (value === null) return undefined;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  const date = Date.parse(trimmed);
  if (Number.isNaN(date)) return undefined;
  return Math.max(0, date - nowMs);
}

/** Reads the spec §7.1 error envelope from a body, if it is one. */
export function readErrorEnvelope(body: unknown): ServerErrorBody | undefined {
  if (!isRecord(body) || !isRecord(body.error)) return undefined;
  const e = body.error;
  if (!isString(e.code)) return undefined;
  return {
    code: e.code,
    message: isString(e.message) ? e.message : "",
    request_id: isString(e.request_id) ? e.request_id : "",
    retryable: e.retryable === true,
    ...(isString(e.doc_url) ? { doc_url: e.doc_url } : {}),
    details: isRecord(e.details) ? e.details : {},
  };
}

/** An SdkError of kind "server" for an error response that carries no verified signature. */
export function serverError(res: HttpResult, nowMs: number, extra: Record<string, unknown> = {}): SdkError {
  const envelope = readErrorEnvelope(res.body);
  const retryAfterMs = parseRetryAfter(res.headers.get("retry-after"), nowMs);
  const transient = res.status === 429 || res.status === 503 || res.status >= 500;
  if (!envelope) {
    return new SdkError("HTTP_ERROR", `unexpected HTTP ${res.status}`, {
      kind: "server",
      status: res.status,
      retryable: transient,
      ...(retryAfterMs === undefined ? {} : { retryAfterMs }),
      details: { ...extra },
    });
  }
  return new SdkError(envelope.code, envelope.message || `server error ${envelope.code}`, {
    kind: "server",
    status: res.status,
    retryable: envelope.retryable || transient,
    requestId: envelope.request_id,
    ...(retryAfterMs === undefined ? {} : { retryAfterMs }),
    serverError: envelope,
    details: { ...envelope.details, ...extra },
  });
}
