import { generateKeyPairSync } from "node:crypto";
import { and, eq } from "drizzle-orm";
import { b64u } from "../../crypto/encoding.ts";
import { p256ScalarOf } from "../../crypto/hpke.ts";
import { keyIdOf, publicKeyText } from "../../crypto/keys.ts";
import { sealingKeyLine } from "../../crypto/sealed-file.ts";
import type { ChangeContext, Deps } from "../../deps.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import { ENVIRONMENTS, type Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import { sealingKeys } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import type { ProductService } from "../products/service.ts";

export type SealingKeyRow = typeof sealingKeys.$inferSelect;

const keystoreId = (keyId: string) => `product-sealing:${keyId}`;

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
 * product's P-256 sealing key, and the key's private half for key release. The private half
 * lives only in the keystore; the store keeps the public half and its status.
 */
export class SealedFileService {
  private readonly scalars = new Map<string, Uint8Array>();

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
    if (!this.activeKey(product.id)) {
      const { privateKey, publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
      const text = publicKeyText(publicKey);
      const keyId = keyIdOf(text);
      const now = this.deps.clock.now();
      try {
        this.deps.keystore.add([
          {
            metadata: {
              id: keystoreId(keyId),
              kind: "sealing_key",
              environment: product.environment,
              alg: "p256",
              created_at: now.toISOString(),
            },
            secret: new Uint8Array(privateKey.export({ format: "der", type: "pkcs8" })),
          },
        ]);
      } catch {
        // Locked by another process past the wait, or the file could not be written.
        throw keyUnavailable();
      }
      this.deps.db.transaction(
        (tx) => {
          // Two first enablings at once: the one that commits first wins, the other's keystore
          // entry stays unused.
          if (this.activeKey(product.id)) return;
          tx.insert(sealingKeys)
            .values({
              keyId,
              productId: product.id,
              environment: product.environment,
              publicKey: text,
              status: "active",
              createdAt: now,
              retiredAt: null,
            })
            .run();
          recordAudit(tx, this.deps, ctx, {
            type: "product.sealed_files_enabled",
            target: { type: "product", id: product.id },
            data: { key_id: keyId },
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
      if (!this.deps.keystore.has(keystoreId(keyId))) this.deps.keystore.refresh();
      scalar = p256ScalarOf(this.deps.keystore.secret(keystoreId(keyId)));
    } catch {
      throw keyUnavailable();
    }
    this.scalars.set(keyId, scalar);
    return scalar;
  }

  private activeKey(productId: string): SealingKeyRow | undefined {
    return this.deps.db
      .select()
      .from(sealingKeys)
      .where(and(eq(sealingKeys.productId, productId), eq(sealingKeys.status, "active")))
      .get();
  }

  private present(productId: string, environment: Environment) {
    const key = this.activeKey(productId);
    const status = !this.offered(environment)
      ? "unavailable"
      : !hasFeature(this.plan(), "sealed_files")
        ? "not_entitled"
        : key
          ? "enabled"
          : "disabled";
    return {
      product_id: productId,
      status: status as "enabled" | "disabled" | "not_entitled" | "unavailable",
      current_key: key
        ? {
            key_id: key.keyId,
            public_key: key.publicKey,
            sealing_key: sealingKeyLine(
              productId,
              key.keyId,
              b64u.decode(key.publicKey.slice("p256:".length)),
            ),
            created_at: key.createdAt.toISOString(),
          }
        : null,
    };
  }
}
