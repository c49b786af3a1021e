import type { Database } from "bun:sqlite";
import { sha256Hex } from "../crypto/encoding.ts";
import { canonicalize } from "../crypto/jcs.ts";
import type { Clock } from "../domain/clock.ts";
import { ApiError } from "./errors.ts";

const KEY_PATTERN = /^[\x21-\x7E]{16,255}$/;
const RETENTION_MS = 24 * 60 * 60 * 1000;
/** Response headers worth replaying; request-specific ones (X-Request-Id, rate limits) are fresh. */
const REPLAYED_HEADERS = ["etag", "location", "content-type"];

export interface IdempotentCall {
  /** Who is calling: the API key id (or device key for runtime calls). */
  scope: string;
  method: string;
  /** The route template, not the concrete path. */
  route: string;
  key: string | undefined;
  body: unknown;
  required: boolean;
}

type Claim =
  | { kind: "claimed" }
  | { kind: "replay"; status: number; body: string; headers: Record<string, string> }
  | { kind: "mismatch" }
  | { kind: "in_flight" };

interface Row {
  fingerprint: string;
  state: "in_flight" | "completed";
  response_status: number | null;
  response_body: string | null;
  response_headers: string | null;
}

/**
 * Idempotency-Key per DESIGN §4. The record is claimed synchronously before any work, so of two
 * concurrent requests with one key only one ever runs: the other sees it in flight (409, retryable)
 * or, once it is done, gets the replay. Only 2xx results are kept; a failed attempt releases the key
 * so a corrected retry can run.
 */
export class IdempotencyStore {
  private readonly insert;
  private readonly select;
  private readonly complete;
  private readonly release;
  private readonly purgeExpired;
  private readonly deleteExpiredOne;

  constructor(
    private readonly sqlite: Database,
    private readonly clock: Clock,
  ) {
    this.insert = sqlite.prepare<unknown, [string, string, string, string, string, number, number]>(
      `INSERT INTO idempotency_records (scope, method, route, idempotency_key, fingerprint, state, created_at, expires_at)
       VALUES (?, ?, ?, ?, ?, 'in_flight', ?, ?) ON CONFLICT DO NOTHING`,
    );
    this.select = sqlite.prepare<Row, [string, string, string, string]>(
      `SELECT fingerprint, state, response_status, response_body, response_headers FROM idempotency_records
       WHERE scope = ? AND method = ? AND route = ? AND idempotency_key = ?`,
    );
    this.complete = sqlite.prepare<unknown, [number, string, string, string, string, string, string]>(
      `UPDATE idempotency_records SET state = 'completed', response_status = ?, response_body = ?, response_headers = ?
       WHERE scope = ? AND method = ? AND route = ? AND idempotency_key = ?`,
    );
    this.release = sqlite.prepare<unknown, [string, string, string, string]>(
      "DELETE FROM idempotency_records WHERE scope = ? AND method = ? AND route = ? AND idempotency_key = ?",
    );
    this.deleteExpiredOne = sqlite.prepare<unknown, [string, string, string, string, number]>(
      `DELETE FROM idempotency_records WHERE scope = ? AND method = ? AND route = ? AND idempotency_key = ?
       AND expires_at <= ?`,
    );
    this.purgeExpired = sqlite.prepare<unknown, [number]>(
      "DELETE FROM idempotency_records WHERE expires_at <= ?",
    );
  }

  /** Runs `work` at most once per key; answers replays and conflicts itself. */
  async run(call: IdempotentCall, work: () => Promise<Response> | Response): Promise<Response> {
    if (call.key === undefined) {
      if (call.required) {
        throw new ApiError(
          "INVALID_REQUEST",
          "This operation needs an Idempotency-Key header (16-255 characters).",
        );
      }
      return work();
    }
    if (!KEY_PATTERN.test(call.key)) {
      throw new ApiError("INVALID_REQUEST", "Idempotency-Key must be 16-255 visible ASCII characters.");
    }
    const ids = [call.scope, call.method, call.route, call.key] as const;
    const claim = this.claim(ids, sha256Hex(canonicalize(call.body ?? null)));
    switch (claim.kind) {
      case "replay":
        return new Response(claim.body, {
          status: claim.status,
          headers: { ...claim.headers, "idempotent-replayed": "true" },
        });
      case "mismatch":
        throw new ApiError(
          "IDEMPOTENCY_CONFLICT",
          "This Idempotency-Key was already used with a different request body.",
        );
      case "in_flight":
        throw new ApiError(
          "IDEMPOTENCY_CONFLICT",
          "A request with this Idempotency-Key is still being processed; retry shortly.",
          {},
          { retryable: true },
        );
    }
    let response: Response;
    try {
      response = await work();
    } catch (error) {
      this.release.run(...ids);
      throw error;
    }
    if (response.status < 200 || response.status > 299) {
      this.release.run(...ids);
      return response;
    }
    const body = await response.text();
    const headers: Record<string, string> = {};
    for (const name of REPLAYED_HEADERS) {
      const value = response.headers.get(name);
      if (value !== null) headers[name] = value;
    }
    this.complete.run(response.status, body, JSON.stringify(headers), ...ids);
    return new Response(body, { status: response.status, headers: response.headers });
  }

  private claim(ids: readonly [string, string, string, string], fingerprint: string): Claim {
    const nowMs = this.clock.now().getTime();
    return this.sqlite
      .transaction((): Claim => {
        this.deleteExpiredOne.run(...ids, nowMs);
        if (this.insert.run(...ids, fingerprint, nowMs, nowMs + RETENTION_MS).changes === 1)
          return { kind: "claimed" };
        const row = this.select.get(...ids);
        if (!row) return { kind: "in_flight" };
        if (row.fingerprint !== fingerprint) return { kind: "mismatch" };
        if (row.state === "in_flight") return { kind: "in_flight" };
        return {
          kind: "replay",
          status: row.response_status ?? 200,
          body: row.response_body ?? "",
          headers: row.response_headers ? (JSON.parse(row.response_headers) as Record<string, string>) : {},
        };
      })
      .immediate();
  }

  /** Expired records, and claims left in flight by a process that died, are dropped. */
  sweep(options: { abandonInFlight: boolean }): number {
    let removed = this.purgeExpired.run(this.clock.now().getTime()).changes;
    if (options.abandonInFlight) {
      removed += this.sqlite.run("DELETE FROM idempotency_records WHERE state = 'in_flight'").changes;
    }
    return removed;
  }
}

/** A management POST, made at most once per (API key, route, Idempotency-Key). */
export function postOnce(
  store: IdempotencyStore,
  route: string,
  request: { caller: { id: string }; headers: Record<string, string | undefined>; body: unknown },
  work: () => Response,
  options: { required: boolean } = { required: true },
): Promise<Response> {
  return store.run(
    {
      scope: request.caller.id,
      method: "POST",
      route,
      key: request.headers["idempotency-key"],
      body: request.body,
      required: options.required,
    },
    work,
  );
}
