import { generateKeyPairSync } from "node:crypto";
import { and, desc, eq, sql } from "drizzle-orm";
import { b64u } from "../../crypto/encoding.ts";
import { keyIdOf, publicKeyText } from "../../crypto/keys.ts";
import { PRODUCT_SEALING_PREFIX } from "../../crypto/keystore.ts";
import { sealingKeyLine } from "../../crypto/sealed-file.ts";
import type { Deps } from "../../deps.ts";
import type { Environment } from "../../domain/scopes.ts";
import { withSyncedCommits } from "../../store/db.ts";
import type { Actor } from "../../store/schema/audit.ts";
import { products, sealingKeys } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";

export type SealingKeyRow = typeof sealingKeys.$inferSelect;
type Reader = Pick<Deps["db"], "select">;

export const sealingKeystoreId = (keyId: string) => `${PRODUCT_SEALING_PREFIX}${keyId}`;

/** A key as the status route and `licensing sealing-keys list` show it; snake_case for JSON. */
export interface SealingKeyView {
  key_id: string;
  status: SealingKeyRow["status"];
  current: boolean;
  public_key: string;
  sealing_key: string;
  created_at: string;
  retired_at: string | null;
}

export function presentSealingKey(row: SealingKeyRow): SealingKeyView {
  return {
    key_id: row.keyId,
    status: row.status,
    current: row.isCurrent,
    public_key: row.publicKey,
    sealing_key: sealingKeyLine(row.productId, row.keyId, b64u.decode(row.publicKey.slice("p256:".length))),
    created_at: row.createdAt.toISOString(),
    retired_at: row.retiredAt?.toISOString() ?? null,
  };
}

/** The key new files are sealed to; undefined until sealed files are enabled. */
export const currentSealingKey = (db: Reader, productId: string): SealingKeyRow | undefined =>
  db
    .select()
    .from(sealingKeys)
    .where(and(eq(sealingKeys.productId, productId), eq(sealingKeys.isCurrent, true)))
    .get();

/** Every key of the product, newest first (rowid breaks ties: two keys made in one millisecond). */
export const sealingKeysOf = (db: Reader, productId: string): SealingKeyRow[] =>
  db
    .select()
    .from(sealingKeys)
    .where(eq(sealingKeys.productId, productId))
    .orderBy(desc(sealingKeys.createdAt), desc(sql`rowid`))
    .all();

export interface NewSealingKey {
  keyId: string;
  publicKey: string;
  now: Date;
}

/**
 * A new P-256 key pair whose private half is already in the keystore: written first and outside
 * any store transaction, so a crash or a failure afterwards leaves an unused keystore entry,
 * never a key row without its private half. Throws what the keystore throws.
 */
export function createSealingKey(deps: Deps, environment: Environment): NewSealingKey {
  const { privateKey, publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const text = publicKeyText(publicKey);
  const keyId = keyIdOf(text);
  const now = deps.clock.now();
  deps.keystore.add([
    {
      metadata: {
        id: sealingKeystoreId(keyId),
        kind: "sealing_key",
        environment,
        alg: "p256",
        created_at: now.toISOString(),
      },
      secret: new Uint8Array(privateKey.export({ format: "der", type: "pkcs8" })),
    },
  ]);
  return { keyId, publicKey: text, now };
}

/** Inside the caller's write transaction: the new key is active and the product's current one. */
export function insertCurrentKey(
  db: Pick<Deps["db"], "insert">,
  productId: string,
  environment: Environment,
  key: NewSealingKey,
): void {
  db.insert(sealingKeys)
    .values({
      keyId: key.keyId,
      productId,
      environment,
      publicKey: key.publicKey,
      status: "active",
      isCurrent: true,
      createdAt: key.now,
      retiredAt: null,
    })
    .run();
}

/** A change the keys' state does not allow (no such key, the current one, nothing enabled); nothing changed. */
export class SealingKeyError extends Error {
  override name = "SealingKeyError";
}

export interface SealingRotation {
  key_id: string;
  sealing_key: string;
  /** The key that was current before: still active, so files sealed to it keep opening. */
  previous_key_id: string;
  /** Every key that releases data keys now, the new one first. */
  releasing_key_ids: string[];
}

export interface SealingRetirement {
  key_id: string;
  status: "retired" | "compromised";
  previous_status: SealingKeyRow["status"];
  /** Whether the private half is gone from the keystore (always false for a plain retirement). */
  private_key_destroyed: boolean;
}

/**
 * Rotating and retiring a product's sealing keys (docs/operations.md "Sealing keys"). Each store
 * change is ONE immediate write transaction with its audit record (which queues the webhook
 * event), so the command line can run it while the server serves: the server reads the key rows
 * on every key release and status request, so it acts on the change at once.
 */
export class SealingKeyLifecycle {
  constructor(private readonly deps: Deps) {}

  /**
   * A new current key; the previous one stays active, so files already sealed to it keep opening
   * until it is retired. Refused before sealed files are enabled: enabling is the vendor's
   * decision (plan, environment) and has its own route and audit event.
   */
  rotate(productId: string, actor: Actor): SealingRotation {
    const environment = this.productEnvironment(productId);
    if (!currentSealingKey(this.deps.db, productId)) throw notEnabled(productId);
    const fresh = createSealingKey(this.deps, environment);
    return this.deps.db.transaction(
      (tx) => {
        // Re-read under the write lock: a rotation by another process may have committed since.
        const previous = currentSealingKey(tx, productId);
        if (!previous) throw notEnabled(productId);
        // Cleared before the insert: the partial unique index allows one current key per product.
        tx.update(sealingKeys).set({ isCurrent: false }).where(eq(sealingKeys.keyId, previous.keyId)).run();
        insertCurrentKey(tx, productId, environment, fresh);
        recordAudit(
          tx,
          this.deps,
          { actor, environment, requestId: null },
          {
            type: "sealing_key.rotated",
            target: { type: "product", id: productId },
            data: { key_id: fresh.keyId, previous_key_id: previous.keyId },
          },
        );
        const rows = sealingKeysOf(tx, productId);
        const created = rows.find((row) => row.keyId === fresh.keyId);
        if (!created) throw new Error(`the new sealing key ${fresh.keyId} was not stored`);
        return {
          key_id: fresh.keyId,
          sealing_key: presentSealingKey(created).sealing_key,
          previous_key_id: previous.keyId,
          releasing_key_ids: rows.filter((row) => row.status === "active").map((row) => row.keyId),
        };
      },
      { behavior: "immediate" },
    );
  }

  /**
   * Stops a key releasing data keys. `compromised` also removes its private half from the
   * keystore, AFTER the status is committed: a crash in between leaves a compromised key whose
   * private half is still held (repeating the command removes it), never an active key whose
   * private half is gone. A retired key may later be declared compromised; the current key
   * cannot be retired (rotate first), so a product with sealed files always has one to seal to.
   */
  retire(
    productId: string,
    keyId: string,
    options: { compromised: boolean; actor: Actor },
  ): SealingRetirement {
    const environment = this.productEnvironment(productId);
    const status = options.compromised ? "compromised" : "retired";
    // The keystore removal that follows a compromise cannot be undone, so the commit before it
    // must survive a power loss: WAL with synchronous=NORMAL (the store's setting) may roll the
    // last commits back, which would leave an active key without its private half.
    const retire = () => this.retireNow(productId, keyId, environment, status, options);
    return options.compromised ? withSyncedCommits(this.deps.sqlite, retire) : retire();
  }

  private retireNow(
    productId: string,
    keyId: string,
    environment: Environment,
    status: "retired" | "compromised",
    options: { actor: Actor },
  ): SealingRetirement {
    const change = this.deps.db.transaction(
      (tx) => {
        const row = tx.select().from(sealingKeys).where(eq(sealingKeys.keyId, keyId)).get();
        if (!row) throw new SealingKeyError(`no sealing key ${keyId} (see licensing sealing-keys list)`);
        if (row.productId !== productId)
          throw new SealingKeyError(`sealing key ${keyId} belongs to ${row.productId}, not ${productId}`);
        if (row.isCurrent)
          throw new SealingKeyError(
            `${keyId} is the current sealing key of ${productId}; rotate first ` +
              `(licensing sealing-keys rotate --product ${productId}), then retire it`,
          );
        if (row.status === status) {
          // Repeating a compromise completes one whose keystore removal did not happen.
          if (status === "compromised" && this.holdsPrivateHalf(keyId)) return { previous: row.status };
          throw new SealingKeyError(`${keyId} is already ${status}`);
        }
        if (row.status === "compromised")
          throw new SealingKeyError(`${keyId} is compromised; it stays compromised`);
        tx.update(sealingKeys)
          .set({ status, retiredAt: row.retiredAt ?? this.deps.clock.now() })
          .where(eq(sealingKeys.keyId, keyId))
          .run();
        recordAudit(
          tx,
          this.deps,
          { actor: options.actor, environment, requestId: null },
          {
            type: `sealing_key.${status}`,
            target: { type: "product", id: productId },
            data: { key_id: keyId, previous_status: row.status },
          },
        );
        return { previous: row.status };
      },
      { behavior: "immediate" },
    );
    let destroyed = false;
    if (status === "compromised") {
      try {
        this.deps.keystore.remove([sealingKeystoreId(keyId)]);
        destroyed = !this.holdsPrivateHalf(keyId);
      } catch (error) {
        throw new SealingKeyError(
          `${keyId} is compromised and releases no data keys, but its private half could not be ` +
            `removed from the keystore (${(error as Error).message}); run the command again`,
        );
      }
    }
    return { key_id: keyId, status, previous_status: change.previous, private_key_destroyed: destroyed };
  }

  keys(productId: string): SealingKeyRow[] {
    this.productEnvironment(productId);
    return sealingKeysOf(this.deps.db, productId);
  }

  holdsPrivateHalf(keyId: string): boolean {
    return this.deps.keystore.has(sealingKeystoreId(keyId));
  }

  private productEnvironment(productId: string): Environment {
    const product = this.deps.db
      .select({ environment: products.environment })
      .from(products)
      .where(eq(products.id, productId))
      .get();
    if (!product) throw new SealingKeyError(`no product ${productId}`);
    return product.environment;
  }
}

const notEnabled = (productId: string) =>
  new SealingKeyError(
    `sealed files are not enabled for ${productId}, so it has no sealing key to rotate; ` +
      `enable them first (POST /mgmt/v1/products/${productId}/sealed-files)`,
  );
