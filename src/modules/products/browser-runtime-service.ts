import type { Database, Statement } from "bun:sqlite";
import { eq } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError, FieldErrorCollector } from "../../http/errors.ts";
import { assertIfMatch, type IfMatch, versionEtag } from "../../http/preconditions.ts";
import { browserRuntimeSettings, products } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import { canonicalOrigin, MAX_ALLOWED_ORIGINS } from "./browser-origins.ts";
import type { BrowserRuntimeUpdateBody } from "./browser-runtime-model.ts";
import { archived, type ProductRow, type ProductService } from "./service.ts";

export interface BrowserRuntimeSettings {
  product_id: string;
  enabled: boolean;
  allowed_origins: string[];
  version: number;
}

export const planLacksBrowserRuntime = () =>
  new ApiError("PLAN_ENTITLEMENT_REQUIRED", "The workspace plan does not include the browser runtime.", {
    entitlement: "browser_runtime",
  });

/**
 * Browser runtime settings of a product (spec §4.3 rule 2). Turning the runtime on needs the
 * plan's `browser_runtime` entitlement; turning it off and editing the list never do, so a
 * downgraded workspace can always tidy up. CORS is served only while the plan has it.
 */
export class BrowserRuntimeService {
  constructor(
    private readonly deps: Deps,
    private readonly products: ProductService,
    private readonly plan: () => PlanDefinition,
    private readonly origins: BrowserOriginCache,
  ) {}

  /** GET: 404 for another environment's product, 409 for an archived one. */
  get(productId: string, environment: Environment): BrowserRuntimeSettings {
    const product = this.products.getActive(productId, environment);
    return this.present(product, this.stored(product.id));
  }

  update(
    productId: string,
    patch: BrowserRuntimeUpdateBody,
    ifMatch: IfMatch | undefined,
    ctx: ChangeContext,
  ): BrowserRuntimeSettings {
    const result = this.deps.db.transaction(
      (tx) => {
        const product = this.products.get(productId, ctx.environment);
        assertIfMatch(ifMatch, versionEtag(product.version));
        if (product.status === "archived") throw archived(product.id);
        const current = this.stored(product.id);
        const next = {
          enabled: patch.enabled ?? current.enabled,
          allowedOrigins:
            patch.allowed_origins === undefined
              ? current.allowedOrigins
              : checkOrigins(patch.allowed_origins, product.environment),
        };
        if (next.enabled && next.allowedOrigins.length === 0) {
          throw ApiError.validation({
            allowed_origins: ["must list at least one origin while the browser runtime is enabled"],
          });
        }
        if (next.enabled && !current.enabled && !hasFeature(this.plan(), "browser_runtime"))
          throw planLacksBrowserRuntime();
        const added = next.allowedOrigins.filter((o) => !current.allowedOrigins.includes(o));
        const removed = current.allowedOrigins.filter((o) => !next.allowedOrigins.includes(o));
        const changes = [
          ...(next.enabled !== current.enabled ? ["enabled"] : []),
          ...(added.length > 0 ||
          removed.length > 0 ||
          !sameOrder(next.allowedOrigins, current.allowedOrigins)
            ? ["allowed_origins"]
            : []),
        ];
        // Resending the current settings changes nothing: no new version, no audit event.
        if (changes.length === 0) return { changed: false, settings: this.present(product, current) };
        const now = this.deps.clock.now();
        const version = product.version + 1;
        tx.insert(browserRuntimeSettings)
          .values({
            productId: product.id,
            enabled: next.enabled,
            allowedOrigins: next.allowedOrigins,
            updatedAt: now,
          })
          .onConflictDoUpdate({
            target: browserRuntimeSettings.productId,
            set: { enabled: next.enabled, allowedOrigins: next.allowedOrigins, updatedAt: now },
          })
          .run();
        tx.update(products).set({ version, updatedAt: now }).where(eq(products.id, product.id)).run();
        recordAudit(tx, this.deps, ctx, {
          type: "product.updated",
          target: { type: "product", id: product.id },
          data: {
            setting: "browser_runtime",
            changes,
            enabled: next.enabled,
            allowed_origins_added: added,
            allowed_origins_removed: removed,
          },
        });
        return { changed: true, settings: this.present({ ...product, version }, next) };
      },
      { behavior: "immediate" },
    );
    // After the commit, so no request sees origins that could still roll back.
    if (result.changed) this.origins.invalidate();
    return result.settings;
  }

  private stored(productId: string): { enabled: boolean; allowedOrigins: string[] } {
    const row = this.deps.db
      .select()
      .from(browserRuntimeSettings)
      .where(eq(browserRuntimeSettings.productId, productId))
      .get();
    return row
      ? { enabled: row.enabled, allowedOrigins: row.allowedOrigins }
      : { enabled: false, allowedOrigins: [] };
  }

  private present(
    product: Pick<ProductRow, "id" | "version">,
    settings: { enabled: boolean; allowedOrigins: string[] },
  ): BrowserRuntimeSettings {
    return {
      product_id: product.id,
      enabled: settings.enabled,
      allowed_origins: [...settings.allowedOrigins],
      version: product.version,
    };
  }
}

/** Every entry checked, each refusal keyed by its index (`allowed_origins.3`), duplicates too. */
function checkOrigins(entries: readonly string[], environment: Environment): string[] {
  const errors = new FieldErrorCollector();
  if (entries.length > MAX_ALLOWED_ORIGINS)
    errors.add("allowed_origins", `must hold at most ${MAX_ALLOWED_ORIGINS} origins`);
  const seen = new Map<string, number>();
  const origins: string[] = [];
  for (const [index, entry] of entries.entries()) {
    const check = canonicalOrigin(entry, environment);
    if ("error" in check) {
      errors.add(`allowed_origins.${index}`, check.error);
      continue;
    }
    const first = seen.get(check.origin);
    if (first !== undefined) {
      errors.add(`allowed_origins.${index}`, `repeats allowed_origins.${first}`);
      continue;
    }
    seen.set(check.origin, index);
    origins.push(check.origin);
  }
  errors.throwIfAny();
  return origins;
}

const sameOrder = (a: readonly string[], b: readonly string[]) =>
  a.length === b.length && a.every((value, i) => value === b[i]);

interface OriginSnapshot {
  loadedAt: number;
  byProduct: Map<string, ReadonlySet<string>>;
  /** Origins allowed by at least one enabled product: what a preflight is answered from. */
  anywhere: ReadonlySet<string>;
}

/** Long enough to keep the store off the hot path, short enough for a `licensing plan set` run by another process. */
const SNAPSHOT_TTL_MS = 5_000;
const ACTIVATION_CACHE_MAX = 10_000;

/**
 * The allowed origins of every enabled product, held in memory for the CORS plugin: the runtime
 * hot path never reads the store for them. A PATCH in this process invalidates the snapshot at
 * once; changes made by another process (the plan, through the command line) show within 5 s.
 * Archiving a product leaves its runtime, and so its CORS, as they were.
 */
export class BrowserOriginCache {
  private snapshot: OriginSnapshot | undefined;
  private readonly activationProducts = new Map<string, string>();
  private readonly enabledRows: Statement<{ product_id: string; allowed_origins: string }, []>;
  private readonly activationProduct: Statement<{ product_id: string }, [string]>;

  constructor(
    sqlite: Database,
    private readonly plan: () => PlanDefinition,
    // Freshness of a cache, not a rule of the domain: real elapsed time, not the injected clock.
    private readonly nowMs: () => number = () => performance.now(),
  ) {
    this.enabledRows = sqlite.prepare(
      "SELECT product_id, allowed_origins FROM browser_runtime_settings WHERE enabled = 1",
    );
    this.activationProduct = sqlite.prepare("SELECT product_id FROM activations WHERE id = ?");
  }

  invalidate(): void {
    this.snapshot = undefined;
  }

  allowedAnywhere(origin: string): boolean {
    return this.current().anywhere.has(origin);
  }

  allows(productId: string, origin: string): boolean {
    return this.current().byProduct.get(productId)?.has(origin) ?? false;
  }

  /**
   * The product an activation belongs to, for device-proof routes. It never changes, so it is
   * remembered; only asked for browser requests from an origin some product allows.
   */
  productOfActivation(activationId: string): string | undefined {
    const known = this.activationProducts.get(activationId);
    if (known) return known;
    const productId = this.activationProduct.get(activationId)?.product_id;
    if (productId) {
      if (this.activationProducts.size >= ACTIVATION_CACHE_MAX) this.activationProducts.clear();
      this.activationProducts.set(activationId, productId);
    }
    return productId;
  }

  private current(): OriginSnapshot {
    const now = this.nowMs();
    if (this.snapshot && now - this.snapshot.loadedAt < SNAPSHOT_TTL_MS) return this.snapshot;
    const byProduct = new Map<string, ReadonlySet<string>>();
    const anywhere = new Set<string>();
    if (hasFeature(this.plan(), "browser_runtime")) {
      for (const row of this.enabledRows.all()) {
        const origins = JSON.parse(row.allowed_origins) as string[];
        byProduct.set(row.product_id, new Set(origins));
        for (const origin of origins) anywhere.add(origin);
      }
    }
    this.snapshot = { loadedAt: now, byProduct, anywhere };
    return this.snapshot;
  }
}
