import { and, desc, eq, lt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatch, type IfMatch, versionEtag } from "../../http/preconditions.ts";
import { products } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import type { ProductCreateBody, ProductUpdateBody } from "./model.ts";

export type ProductRow = typeof products.$inferSelect;

export function presentProduct(row: ProductRow) {
  return {
    public_id: row.id,
    name: row.name,
    code: row.code,
    description: row.description,
    environment: row.environment,
    status: row.status,
    trust_bundle_sequence: row.trustBundleSequence,
    signing_status: row.signingStatus,
    version: row.version,
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

export class ProductService {
  /** `provisionSigning` gives a new product its signing keys; a failure leaves it `pending` for a retry. */
  constructor(
    private readonly deps: Deps,
    private readonly provisionSigning: (productId: string) => void = () => {},
  ) {}

  list(environment: Environment, page: PageRequest): ProductRow[] {
    return this.deps.db
      .select()
      .from(products)
      .where(
        and(eq(products.environment, environment), page.before ? lt(products.id, page.before) : undefined),
      )
      .orderBy(desc(products.id))
      .limit(page.limit + 1)
      .all();
  }

  /** A product of another environment does not exist for this caller. */
  get(id: string, environment: Environment): ProductRow {
    const row = this.deps.db.select().from(products).where(eq(products.id, id)).get();
    if (!row || row.environment !== environment) throw ApiError.notFound("product");
    return row;
  }

  /** For routes that act on a product's configuration: archived products answer 409. */
  getActive(id: string, environment: Environment): ProductRow {
    const row = this.get(id, environment);
    if (row.status === "archived") throw archived(row.id);
    return row;
  }

  create(input: ProductCreateBody, ctx: ChangeContext): ProductRow {
    // The key decides the environment; the field may only confirm it.
    const environment = input.environment ?? ctx.environment;
    if (environment !== ctx.environment) throw environmentMismatch(ctx.environment);
    const now = this.deps.clock.now();
    const row: ProductRow = {
      id: this.deps.ids.next("product", now.getTime()),
      environment,
      name: input.name,
      code: input.code,
      description: input.description ?? "",
      status: "active",
      trustBundleSequence: 0,
      trustBundleMinimumSequence: 0,
      signingStatus: "pending",
      version: 1,
      createdAt: now,
      updatedAt: now,
      archivedAt: null,
    };
    this.deps.db.transaction((tx) => {
      this.assertCodeFree(input.code, environment, null);
      tx.insert(products).values(row).run();
      recordAudit(tx, this.deps, ctx, {
        type: "product.created",
        target: { type: "product", id: row.id },
        data: { name: row.name, code: row.code },
      });
    });
    try {
      this.provisionSigning(row.id);
    } catch {
      // The product exists; its keys follow when provisioning is retried (start-up, next activation).
    }
    return this.get(row.id, row.environment);
  }

  update(id: string, patch: ProductUpdateBody, ifMatch: IfMatch | undefined, ctx: ChangeContext): ProductRow {
    return this.deps.db.transaction((tx) => {
      const current = this.get(id, ctx.environment);
      assertIfMatch(ifMatch, versionEtag(current.version));
      if (current.status === "archived") throw archived(id);
      if (patch.environment !== undefined && patch.environment !== current.environment) {
        throw ApiError.validation({
          environment: ["cannot change; create a product in the other environment"],
        });
      }
      const changes: Partial<ProductRow> = {};
      if (patch.name !== undefined && patch.name !== current.name) changes.name = patch.name;
      if (patch.description !== undefined && patch.description !== current.description)
        changes.description = patch.description;
      if (patch.code !== undefined && patch.code !== current.code) {
        this.assertCodeFree(patch.code, current.environment, id);
        changes.code = patch.code;
      }
      if (Object.keys(changes).length === 0) return current;
      const next: ProductRow = {
        ...current,
        ...changes,
        version: current.version + 1,
        updatedAt: this.deps.clock.now(),
      };
      tx.update(products)
        .set({ ...changes, version: next.version, updatedAt: next.updatedAt })
        .where(eq(products.id, id))
        .run();
      recordAudit(tx, this.deps, ctx, {
        type: "product.updated",
        target: { type: "product", id },
        data: { changes: Object.keys(changes) },
      });
      return next;
    });
  }

  /** Archiving twice is harmless; a stale If-Match still refuses. */
  archive(id: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    this.deps.db.transaction((tx) => {
      const current = this.get(id, ctx.environment);
      assertIfMatch(ifMatch, versionEtag(current.version));
      if (current.status === "archived") return;
      const now = this.deps.clock.now();
      tx.update(products)
        .set({ status: "archived", archivedAt: now, updatedAt: now, version: current.version + 1 })
        .where(eq(products.id, id))
        .run();
      recordAudit(tx, this.deps, ctx, { type: "product.archived", target: { type: "product", id } });
    });
  }

  private assertCodeFree(code: string, environment: Environment, exceptId: string | null): void {
    const clash = this.deps.db
      .select({ id: products.id })
      .from(products)
      .where(and(eq(products.environment, environment), eq(products.code, code)))
      .get();
    if (clash && clash.id !== exceptId) {
      throw ApiError.validation({ code: ["is already used by another product in this environment"] });
    }
  }
}

export const archived = (id: string) =>
  new ApiError("PRODUCT_ARCHIVED", "The product is archived.", { product_id: id });

export const environmentMismatch = (environment: Environment) =>
  new ApiError("ENVIRONMENT_MISMATCH", `This ${environment} API key cannot act on the other environment.`, {
    key_environment: environment,
  });
