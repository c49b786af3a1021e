import { and, eq } from "drizzle-orm";
import type { Deps } from "../../deps.ts";
import { policies } from "../../store/schema/index.ts";
import type { ProductService } from "../products/service.ts";
import type { TrustService } from "./service.ts";

export const SERVICE_CONFIG_VERSION = 1;
export const BUNDLE_VERSION = "service-trust-bundle-v1";

/**
 * The `service.config.json` a vendor commits to the app's repository (spec §2.4, rule 1): the
 * trust anchor the SDK starts from, consistent with the bundle served to devices.
 */
export class IntegrationConfigService {
  constructor(
    private readonly deps: Deps,
    private readonly products: ProductService,
    private readonly trust: TrustService,
    private readonly baseUrl: string,
  ) {}

  build(productId: string, environment: "live" | "test") {
    const product = this.products.getActive(productId, environment);
    const root = this.trust.root(product.environment);
    const pending = product.signingStatus !== "ready";
    const entitlements = new Map<string, { type: string; policies: string[] }>();
    for (const policy of this.deps.db
      .select()
      .from(policies)
      .where(and(eq(policies.productId, product.id), eq(policies.status, "active")))
      .all()) {
      for (const [name, value] of Object.entries(policy.entitlements)) {
        const entry = entitlements.get(name) ?? {
          type: typeof value === "boolean" ? "boolean" : "json",
          policies: [],
        };
        entry.policies.push(policy.id);
        entitlements.set(name, entry);
      }
    }
    const config = {
      service_config_version: SERVICE_CONFIG_VERSION,
      generated_at: this.deps.clock.now().toISOString(),
      bundle_version: BUNDLE_VERSION,
      environment: product.environment,
      api_url: this.baseUrl,
      product: { id: product.id, name: product.name },
      trust_anchor: {
        signing_mode: "delegated",
        key_id: root.keyId,
        trust_bundle_url: `${this.baseUrl}/runtime/v1/products/${product.id}/trust-bundle`,
        minimum_trust_bundle_sequence: product.trustBundleMinimumSequence,
        root_public_key: product.environment === "live" ? root.publicKey : null,
        development_root_public_key: product.environment === "test" ? root.publicKey : null,
        public_key_unavailable_reason: null,
        signing_keys_pending_reason: pending
          ? "The product's signing keys are being created; download again shortly."
          : null,
      },
      entitlements: [...entitlements]
        .sort(([a], [b]) => (a < b ? -1 : 1))
        .map(([name, e]) => ({ name, ...e })),
      license_key_delivery: "manual",
      billing_license_claim_url: null,
    };
    return {
      file_name: "service.config.json" as const,
      content: `${JSON.stringify(config, null, 2)}\n`,
      config,
    };
  }
}
