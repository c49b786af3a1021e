import { randomBytes } from "node:crypto";
import { desc, eq } from "drizzle-orm";
import { sha256Hex } from "../../crypto/encoding.ts";
import type { Deps } from "../../deps.ts";
import type { Environment, Scope } from "../../domain/scopes.ts";
import { type Actor, apiKeys } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const SECRET_CHARS = 32;
const KEY_PATTERN = /^lsk_(live|test)_[0-9A-Za-z]{32}$/;
/** last_used_at is a hint for operators; writing it on every request would cost a write per call. */
const LAST_USED_RESOLUTION_MS = 60_000;

export interface ApiKeyIdentity {
  id: string;
  name: string;
  environment: Environment;
  scopes: ReadonlySet<Scope>;
}

export interface ApiKeySummary {
  id: string;
  name: string;
  environment: Environment;
  scopes: Scope[];
  hint: string;
  created_at: string;
  revoked_at: string | null;
  last_used_at: string | null;
}

/** `lsk_<env>_` + 32 base62 characters (~190 bits), rejection-sampled so every character is uniform. */
function newSecret(environment: Environment): string {
  let out = "";
  while (out.length < SECRET_CHARS) {
    for (const byte of randomBytes(48)) {
      if (byte < 248 && out.length < SECRET_CHARS) out += BASE62[byte % 62];
    }
  }
  return `lsk_${environment}_${out}`;
}

export class ApiKeyService {
  private readonly byHash;
  private readonly touch;
  private readonly lastTouched = new Map<string, number>();

  /** Needs no keystore: the CLI manages keys without the passphrase. */
  constructor(private readonly deps: Pick<Deps, "db" | "sqlite" | "clock" | "ids">) {
    this.byHash = deps.sqlite.prepare<
      { id: string; name: string; environment: Environment; scopes: string; revoked_at: number | null },
      [string]
    >("SELECT id, name, environment, scopes, revoked_at FROM api_keys WHERE token_hash = ?");
    this.touch = deps.sqlite.prepare<unknown, [number, string]>(
      "UPDATE api_keys SET last_used_at = ?, usage_count = usage_count + 1 WHERE id = ?",
    );
  }

  /** With an `actor`, the creation is audited in the key's environment (the CLI passes one). */
  create(
    input: { environment: Environment; scopes: Scope[]; name: string },
    actor?: Actor,
  ): { apiKey: string; id: string } {
    const apiKey = newSecret(input.environment);
    const now = this.deps.clock.now();
    const id = this.deps.ids.next("apiKey", now.getTime());
    // One transaction: a key whose creation could not be audited would work without its secret
    // ever having been shown (the caller fails before printing it).
    this.deps.db.transaction((tx) => {
      tx.insert(apiKeys)
        .values({
          id,
          environment: input.environment,
          name: input.name,
          scopes: [...new Set(input.scopes)],
          tokenHash: sha256Hex(apiKey),
          tokenHint: `${apiKey.slice(0, 13)}…`,
          createdAt: now,
        })
        .run();
      if (actor) {
        recordAudit(
          tx,
          this.deps,
          { actor, environment: input.environment, requestId: null },
          {
            type: "api_key.created",
            target: { type: "api_key", id },
            data: { name: input.name, scopes: input.scopes },
          },
        );
      }
    });
    return { apiKey, id };
  }

  /** Null for anything that is not a live, unrevoked key; callers answer 401 without saying why. */
  authenticate(token: string): ApiKeyIdentity | null {
    if (!KEY_PATTERN.test(token)) return null;
    const row = this.byHash.get(sha256Hex(token));
    if (!row || row.revoked_at !== null) return null;
    const nowMs = this.deps.clock.now().getTime();
    if (nowMs - (this.lastTouched.get(row.id) ?? 0) >= LAST_USED_RESOLUTION_MS) {
      this.lastTouched.set(row.id, nowMs);
      this.touch.run(nowMs, row.id);
    }
    return {
      id: row.id,
      name: row.name,
      environment: row.environment,
      scopes: new Set(JSON.parse(row.scopes) as Scope[]),
    };
  }

  list(): ApiKeySummary[] {
    return this.deps.db
      .select()
      .from(apiKeys)
      .orderBy(desc(apiKeys.id))
      .all()
      .map((row) => ({
        id: row.id,
        name: row.name,
        environment: row.environment,
        scopes: row.scopes as Scope[],
        hint: row.tokenHint,
        created_at: row.createdAt.toISOString(),
        revoked_at: row.revokedAt?.toISOString() ?? null,
        last_used_at: row.lastUsedAt?.toISOString() ?? null,
      }));
  }

  /** Returns false when no such key exists; revoking twice keeps the first revocation time. */
  revoke(id: string, actor?: Actor): boolean {
    // Read, revocation and audit record in one immediate transaction: the revocation stands only
    // with its record, and a server writing meanwhile cannot slip between the read and the write.
    return this.deps.db.transaction(
      (tx) => {
        const row = tx.select().from(apiKeys).where(eq(apiKeys.id, id)).get();
        if (!row) return false;
        if (row.revokedAt === null) {
          tx.update(apiKeys).set({ revokedAt: this.deps.clock.now() }).where(eq(apiKeys.id, id)).run();
          if (actor) {
            recordAudit(
              tx,
              this.deps,
              { actor, environment: row.environment, requestId: null },
              {
                type: "api_key.revoked",
                target: { type: "api_key", id },
              },
            );
          }
        }
        return true;
      },
      { behavior: "immediate" },
    );
  }
}
