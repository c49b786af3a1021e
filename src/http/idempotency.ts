import type { Database } from "bun:sqlite";
import { sha256Hex } from "../crypto/encoding.ts";
import { canonicalize } from "../crypto/jcs.ts";
import type { SecretBox } from "../crypto/secret-box.ts";
import type { Clock } from "../domain/clock.ts";
import { ApiError } from "./errors.ts";

const KEY_PATTERN = /^[\x21-\x7E]{16,255}$/;
const RETENTION_MS = 24 * 60 * 60 * 1000;

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

/** What an idempotent operation produced: kept verbatim and replayed for the same key and body. */
export interface IdempotentResult {
  status: number;
  body: unknown;
  /** Headers worth replaying, e.g. ETag. */
  headers?: Record<string, string>;
}

export interface Outcome {
  status: number;
  /** The JSON text of the body. */
  body: string;
  headers: Record<string, string>;
  replayed: boolean;
}

const serialize = (result: IdempotentResult) => ({
  status: result.status,
  body: JSON.stringify(result.body),
  headers: result.headers ?? {},
});

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

  /**
   * With `secrets`, stored response bodies are encrypted: a replayed create answers with what it
   * first answered, and for a license that includes its key, which must not sit in the store (and
   * its backups) in the clear. Bodies stored without encryption (by a sweeper-only instance, or
   * before this was added) are still replayed.
   */
  constructor(
    private readonly sqlite: Database,
    private readonly clock: Clock,
    private readonly secrets?: SecretBox,
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

  /**
   * Runs `work` at most once per key and answers replays and conflicts itself. `work` runs inside
   * the same transaction that completes the record, so a crash leaves both or neither: never a
   * resource whose key a retry would not find.
   */
  execute(call: IdempotentCall, work: () => IdempotentResult): Outcome {
    if (call.key === undefined) {
      if (call.required) {
        throw new ApiError(
          "INVALID_REQUEST",
          "This operation needs an Idempotency-Key header (16-255 characters).",
        );
      }
      return { ...serialize(work()), replayed: false };
    }
    if (!KEY_PATTERN.test(call.key)) {
      throw new ApiError("INVALID_REQUEST", "Idempotency-Key must be 16-255 visible ASCII characters.");
    }
    const ids = [call.scope, call.method, call.route, call.key] as const;
    const claim = this.claim(ids, sha256Hex(canonicalize(call.body ?? null)));
    switch (claim.kind) {
      case "replay":
        return { status: claim.status, body: claim.body, headers: claim.headers, replayed: true };
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
    try {
      return this.sqlite
        .transaction((): Outcome => {
          const result = serialize(work());
          if (result.status >= 200 && result.status <= 299) {
            const stored = this.secrets ? this.secrets.encrypt(result.body, bodyContext(ids)) : result.body;
            this.complete.run(result.status, stored, JSON.stringify(result.headers), ...ids);
          } else {
            this.release.run(...ids);
          }
          return { ...result, replayed: false };
        })
        .immediate();
    } catch (error) {
      // The work's writes rolled back with the transaction; free the key for a corrected retry.
      this.release.run(...ids);
      throw error;
    }
  }

  /** `execute` as an HTTP response, with `Idempotent-Replayed: true` on a replay. */
  run(call: IdempotentCall, work: () => IdempotentResult): Response {
    const outcome = this.execute(call, work);
    return new Response(outcome.body, {
      status: outcome.status,
      headers: {
        "content-type": "application/json",
        ...outcome.headers,
        ...(outcome.replayed ? { "idempotent-replayed": "true" } : {}),
      },
    });
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
          body: this.readBody(row.response_body ?? "", ids),
          headers: row.response_headers ? (JSON.parse(row.response_headers) as Record<string, string>) : {},
        };
      })
      .immediate();
  }

  /** A JSON body starts with `{` or `[`; an encrypted one with the SecretBox's `v1.`. */
  private readBody(stored: string, ids: readonly [string, string, string, string]): string {
    if (!stored.startsWith("v1.")) return stored;
    if (!this.secrets) throw new Error("an encrypted idempotency record needs the data key to replay");
    return this.secrets.decrypt(stored, bodyContext(ids));
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

/** Binds an encrypted body to its record, so it cannot be moved to another key's record and replayed there. */
const bodyContext = (ids: readonly [string, string, string, string]) =>
  `idempotency-response:${ids.join("\n")}`;

/** A management POST, made at most once per (API key, route, Idempotency-Key). */
export function postOnce(
  store: IdempotencyStore,
  route: string,
  request: { caller: { id: string }; headers: Record<string, string | undefined>; body: unknown },
  work: () => IdempotentResult,
  options: { required: boolean } = { required: true },
): Response {
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
