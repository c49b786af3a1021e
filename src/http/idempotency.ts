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
  /** The body as a value: the work's own result, or for a replay the stored text parsed. */
  value: unknown;
  headers: Record<string, string>;
  replayed: boolean;
}

const serialize = (result: IdempotentResult) => ({
  status: result.status,
  body: JSON.stringify(result.body),
  value: result.body,
  headers: result.headers ?? {},
});

interface Row {
  fingerprint: string;
  state: "in_flight" | "completed";
  response_status: number | null;
  response_body: string | null;
  response_headers: string | null;
  expires_at: number;
}

/**
 * Idempotency-Key per DESIGN §4. The lookup, the work and the record of its result are one
 * transaction (a savepoint inside a caller's), so of two requests with one key only one ever runs
 * and the other gets the replay, and a crash leaves the work and its record both or neither. Only
 * 2xx results are kept; a failed attempt leaves no record, so a corrected retry can run.
 * `in_flight` records come only from versions that claimed a key before the work: they answer 409
 * (retryable) until the sweeper drops them.
 */
export class IdempotencyStore {
  private readonly select;
  private readonly record;
  private readonly purgeExpired;
  /** Made once: bun:sqlite builds a transaction wrapper and its variants on every call otherwise. */
  private readonly atomically;

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
    this.select = sqlite.prepare<Row, [string, string, string, string]>(
      `SELECT fingerprint, state, response_status, response_body, response_headers, expires_at
       FROM idempotency_records WHERE scope = ? AND method = ? AND route = ? AND idempotency_key = ?`,
    );
    // An expired record of the same key is replaced in place.
    this.record = sqlite.prepare<
      unknown,
      [string, string, string, string, string, number, string, string, number, number]
    >(
      `INSERT INTO idempotency_records (scope, method, route, idempotency_key, fingerprint, state,
         response_status, response_body, response_headers, created_at, expires_at)
       VALUES (?, ?, ?, ?, ?, 'completed', ?, ?, ?, ?, ?)
       ON CONFLICT (scope, method, route, idempotency_key) DO UPDATE SET fingerprint = excluded.fingerprint,
         state = 'completed', response_status = excluded.response_status, response_body = excluded.response_body,
         response_headers = excluded.response_headers, created_at = excluded.created_at,
         expires_at = excluded.expires_at`,
    );
    this.purgeExpired = sqlite.prepare<unknown, [number]>(
      "DELETE FROM idempotency_records WHERE expires_at <= ?",
    );
    this.atomically = sqlite.transaction((run: () => Outcome): Outcome => run());
  }

  /** Runs `work` at most once per key and answers replays and conflicts itself. */
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
    const fingerprint = sha256Hex(canonicalize(call.body ?? null));
    const nowMs = this.clock.now().getTime();
    return this.atomically.immediate((): Outcome => {
      const earlier = this.select.get(...ids);
      if (earlier && earlier.expires_at > nowMs) return this.replay(earlier, fingerprint, ids);
      const result = serialize(work());
      if (result.status >= 200 && result.status <= 299) {
        const stored = this.secrets ? this.secrets.encrypt(result.body, bodyContext(ids)) : result.body;
        const headers = JSON.stringify(result.headers);
        this.record.run(...ids, fingerprint, result.status, stored, headers, nowMs, nowMs + RETENTION_MS);
      }
      return { ...result, replayed: false };
    });
  }

  /** The earlier answer for this key, or why there is none to give. */
  private replay(earlier: Row, fingerprint: string, ids: readonly [string, string, string, string]): Outcome {
    if (earlier.fingerprint !== fingerprint) {
      throw new ApiError(
        "IDEMPOTENCY_CONFLICT",
        "This Idempotency-Key was already used with a different request body.",
      );
    }
    if (earlier.state === "in_flight") {
      throw new ApiError(
        "IDEMPOTENCY_CONFLICT",
        "A request with this Idempotency-Key is still being processed; retry shortly.",
        {},
        { retryable: true },
      );
    }
    const body = this.readBody(earlier.response_body ?? "", ids);
    return {
      status: earlier.response_status ?? 200,
      body,
      value: JSON.parse(body),
      headers: earlier.response_headers
        ? (JSON.parse(earlier.response_headers) as Record<string, string>)
        : {},
      replayed: true,
    };
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
