import { eq } from "drizzle-orm";
import { p256ScalarOf } from "../../crypto/hpke.ts";
import type { ChangeContext, Deps } from "../../deps.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import { ENVIRONMENTS, type Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import { sealingKeys } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import type { ProductService } from "../products/service.ts";
import {
  createSealingKey,
  currentSealingKey,
  insertCurrentKey,
  type NewSealingKey,
  presentSealingKey,
  type SealingKeyRow,
  sealingKeysOf,
  sealingKeystoreId,
} from "./lifecycle.ts";

export type { SealingKeyRow } from "./lifecycle.ts";

export const keyUnavailable = () =>
  new ApiError(
    "SEALED_FILES_KEY_UNAVAILABLE",
    "The product's sealing key cannot be reached right now; retry shortly.",
    {},
    { retryable: true },
  );

export const planLacksSealedFiles = () =>
  new ApiError("PLAN_ENTITLEMENT_REQUIRED", "The workspace plan does not include sealed files.", {
    entitlement: "sealed_files",
  });

export const sealedFilesUnavailable = (environment: Environment) =>
  new ApiError("SEALED_FILES_UNAVAILABLE", `The ${environment} environment does not offer sealed files.`, {
    environment,
  });

/**
 * Sealed files of a product (spec §3.1, §3.2): the status, the one-way enabling that creates the
 * product's first P-256 sealing key, and the keys' private halves for key release. The private
 * halves live only in the keystore; the store keeps the public halves and their status. Rotating
 * and retiring keys is the command line's (lifecycle.ts).
 */
export class SealedFileService {
  private readonly scalars = new Map<string, Uint8Array>();
  /** Keys whose private half this process dropped after they stopped releasing (see `forget`). */
  private readonly forgotten = new Set<string>();
  /** Keystore ids of compromised keys known gone from the keystore file (see `completeCompromises`). */
  private readonly removedKeys = new Set<string>();

  constructor(
    private readonly deps: Deps,
    private readonly products: ProductService,
    private readonly plan: () => PlanDefinition,
    /** Which environments offer sealed files (configuration; both by default). */
    private readonly environments: readonly Environment[] = ENVIRONMENTS,
  ) {}

  offered(environment: Environment): boolean {
    return this.environments.includes(environment);
  }

  /** GET: 404 for another environment's product, 409 for an archived one. */
  status(productId: string, environment: Environment) {
    const product = this.products.getActive(productId, environment);
    return this.present(product.id, product.environment);
  }

  /**
   * POST: idempotent. The first enabling creates the key (keystore first, then the store, so a
   * crash in between leaves an unused keystore entry, never a key without its private half) and
   * is audited; later calls change nothing and answer the same.
   */
  enable(productId: string, ctx: ChangeContext) {
    const product = this.products.getActive(productId, ctx.environment);
    if (!this.offered(product.environment)) throw sealedFilesUnavailable(product.environment);
    if (!hasFeature(this.plan(), "sealed_files")) throw planLacksSealedFiles();
    if (!currentSealingKey(this.deps.db, product.id)) {
      let fresh: NewSealingKey;
      try {
        fresh = createSealingKey(this.deps, product.environment);
      } catch {
        // Locked by another process past the wait, or the file could not be written.
        throw keyUnavailable();
      }
      this.deps.db.transaction(
        (tx) => {
          // Two first enablings at once: the one that commits first wins, the other's keystore
          // entry stays unused.
          if (currentSealingKey(tx, product.id)) return;
          insertCurrentKey(tx, product.id, product.environment, fresh);
          recordAudit(tx, this.deps, ctx, {
            type: "product.sealed_files_enabled",
            target: { type: "product", id: product.id },
            data: { key_id: fresh.keyId },
          });
        },
        { behavior: "immediate" },
      );
    }
    return this.present(product.id, product.environment);
  }

  keyRow(keyId: string): SealingKeyRow | undefined {
    return this.deps.db.select().from(sealingKeys).where(eq(sealingKeys.keyId, keyId)).get();
  }

  /** The private scalar for key release; 503 when the keystore cannot give it. */
  privateScalar(keyId: string): Uint8Array {
    let scalar = this.scalars.get(keyId);
    if (scalar) return scalar;
    try {
      // Another process on the same data dir may have created it after this one read the file.
      if (!this.deps.keystore.has(sealingKeystoreId(keyId))) this.deps.keystore.refresh();
      scalar = p256ScalarOf(this.deps.keystore.secret(sealingKeystoreId(keyId)));
    } catch {
      throw keyUnavailable();
    }
    this.scalars.set(keyId, scalar);
    return scalar;
  }

  /**
   * A key that no longer releases (retired or compromised from the command line, in another
   * process): drop the scalar this process keeps, and for a compromised key re-read the keystore
   * once, so the private half the command removed from the file leaves this process's memory too.
   * Once per key, whatever the file said: a device sending such headers again costs no file read
   * on the request thread. A removal that had not happened yet is the sweep's to finish
   * (`completeCompromises`, whose removal also drops the key from this process's memory).
   */
  forget(key: SealingKeyRow): void {
    this.dropScalar(key.keyId);
    if (key.status !== "compromised" || this.forgotten.has(key.keyId)) return;
    this.forgotten.add(key.keyId);
    try {
      if (this.deps.keystore.has(sealingKeystoreId(key.keyId))) this.deps.keystore.refresh();
    } catch {
      // Hygiene only: the key's status already refuses every release.
    }
  }

  /**
   * Finishes compromises whose keystore removal did not happen (the command was killed, or the
   * keystore was locked, between its commit and the removal): the store already refuses these
   * keys, so their private halves go from the keystore, and from backups taken afterwards. A sweep
   * step; answers how many were removed.
   */
  completeCompromises(): number {
    const compromisedKeyIds = this.deps.db
      .select({ keyId: sealingKeys.keyId })
      .from(sealingKeys)
      .where(eq(sealingKeys.status, "compromised"))
      .all()
      .map((row) => row.keyId);
    // The scalar this process derived for key release goes too, whether or not a device asks for
    // the key again (forget runs only then): a compromise must leave this process's memory.
    for (const keyId of compromisedKeyIds) this.dropScalar(keyId);
    const compromised = compromisedKeyIds.map(sealingKeystoreId);
    // A key the command line made after this process read the keystore is in the file but not
    // here: re-read the file (no lock, no scrypt) before judging what it still holds. Once a
    // key's removal is done here it is known gone, and later sweeps read no file for it.
    const unknown = compromised.filter((id) => !this.deps.keystore.has(id) && !this.removedKeys.has(id));
    if (unknown.length > 0) {
      this.deps.keystore.refresh();
      for (const id of unknown) if (!this.deps.keystore.has(id)) this.removedKeys.add(id);
    }
    const held = compromised.filter((id) => this.deps.keystore.has(id));
    if (held.length === 0) return 0;
    const removed = this.deps.keystore.remove(held);
    for (const id of held) this.removedKeys.add(id);
    return removed.length;
  }

  private dropScalar(keyId: string): void {
    const scalar = this.scalars.get(keyId);
    if (!scalar) return;
    scalar.fill(0);
    this.scalars.delete(keyId);
  }

  private present(productId: string, environment: Environment) {
    const keys = sealingKeysOf(this.deps.db, productId);
    const current = keys.some((key) => key.isCurrent);
    const status = !this.offered(environment)
      ? "unavailable"
      : !hasFeature(this.plan(), "sealed_files")
        ? "not_entitled"
        : current
          ? "enabled"
          : "disabled";
    const shown = keys.map(presentSealingKey);
    const currentKey = shown.find((key) => key.current);
    return {
      product_id: productId,
      status: status as "enabled" | "disabled" | "not_entitled" | "unavailable",
      // The fields this route has always had for the current key; `keys` adds the others.
      current_key: currentKey
        ? {
            key_id: currentKey.key_id,
            public_key: currentKey.public_key,
            sealing_key: currentKey.sealing_key,
            created_at: currentKey.created_at,
          }
        : null,
      keys: shown,
    };
  }
}
