/**
 * The integration config an app embeds (`service.config.json`, spec §2.4 "Integration config").
 * The SDK accepts either the config object itself or the management response `data` that wraps it
 * under `config`.
 */
import { SdkError } from "./errors.ts";
import { keyIdOf, parsePublicKey } from "./keys.ts";

export type Environment = "live" | "test";

export interface TrustAnchor {
  signing_mode?: string | null;
  key_id: string;
  trust_bundle_url?: string | null;
  minimum_trust_bundle_sequence?: number | null;
  root_public_key?: string | null;
  development_root_public_key?: string | null;
  public_key_unavailable_reason?: string | null;
  signing_keys_pending_reason?: string | null;
}

export interface ServiceConfig {
  service_config_version: 1;
  generated_at?: string;
  bundle_version?: string;
  environment: Environment;
  api_url: string;
  product: { id: string; name?: string };
  trust_anchor: TrustAnchor;
  entitlements?: { name: string; type: string; policies: string[] }[];
  license_key_delivery?: string;
  billing_license_claim_url?: string | null;
}

/** What the SDK derives from the config once, at construction. */
export interface ResolvedConfig {
  raw: ServiceConfig;
  productId: string;
  environment: Environment;
  /** api_url without trailing slashes. */
  apiBase: string;
  trustBundleUrl: string;
  rootPublicKey: string;
  rootKeyId: string;
  minimumBundleSequence: number;
}

function invalid(message: string, details: Record<string, unknown> = {}): SdkError {
  return new SdkError("CONFIG_INVALID", message, { kind: "usage", details });
}

function isHttpUrl(value: unknown): value is string {
  if (typeof value !== "string") return false;
  try {
    const u = new URL(value);
    return u.protocol === "https:" || u.protocol === "http:";
  } catch {
    return false;
  }
}

export function resolveConfig(input: unknown): ResolvedConfig {
  if (typeof input !== "object" || input === null) throw invalid("config must be an object");
  let cfg = input as Record<string, unknown>;
  if (cfg.service_config_version === undefined && typeof cfg.config === "object" && cfg.config !== null) {
    cfg = cfg.config as Record<string, unknown>;
  }
  if (cfg.service_config_version !== 1) {
    throw invalid("unsupported service_config_version", {
      service_config_version: cfg.service_config_version,
    });
  }
  const environment = cfg.environment;
  if (environment !== "live" && environment !== "test") throw invalid("environment must be live or test");
  if (!isHttpUrl(cfg.api_url)) throw invalid("api_url must be an http(s) URL");
  const product = cfg.product as Record<string, unknown> | undefined;
  if (
    typeof product !== "object" ||
    product === null ||
    typeof product.id !== "string" ||
    product.id === ""
  ) {
    throw invalid("product.id is required");
  }
  const anchor = cfg.trust_anchor as Record<string, unknown> | undefined;
  if (typeof anchor !== "object" || anchor === null) throw invalid("trust_anchor is required");
  if (typeof anchor.key_id !== "string" || anchor.key_id === "")
    throw invalid("trust_anchor.key_id is required");

  const rootField = environment === "live" ? "root_public_key" : "development_root_public_key";
  const rootPublicKey = anchor[rootField];
  if (typeof rootPublicKey !== "string" || rootPublicKey === "") {
    throw new SdkError("TRUST_ANCHOR_UNAVAILABLE", `trust_anchor.${rootField} is not set`, {
      kind: "usage",
      details: { reason: anchor.public_key_unavailable_reason ?? null },
    });
  }
  let parsedRoot: ReturnType<typeof parsePublicKey>;
  try {
    parsedRoot = parsePublicKey(rootPublicKey);
  } catch (cause) {
    throw invalid(`trust_anchor.${rootField} is not a valid public key`, { cause: String(cause) });
  }
  if (parsedRoot.alg !== "ed25519") throw invalid(`trust_anchor.${rootField} must be an ed25519 key`);
  if (keyIdOf(rootPublicKey) !== anchor.key_id) {
    throw invalid(`trust_anchor.key_id does not match trust_anchor.${rootField}`, {
      key_id: anchor.key_id,
      expected: keyIdOf(rootPublicKey),
    });
  }
  const minSeq = anchor.minimum_trust_bundle_sequence ?? 0;
  if (typeof minSeq !== "number" || !Number.isSafeInteger(minSeq) || minSeq < 0) {
    throw invalid("trust_anchor.minimum_trust_bundle_sequence must be a non-negative integer");
  }

  const apiBase = (cfg.api_url as string).replace(/\/+$/, "");
  const productId = product.id;
  const trustBundleUrl = isHttpUrl(anchor.trust_bundle_url)
    ? anchor.trust_bundle_url
    : `${apiBase}/runtime/v1/products/${encodeURIComponent(productId)}/trust-bundle`;

  return {
    raw: cfg as unknown as ServiceConfig,
    productId,
    environment,
    apiBase,
    trustBundleUrl,
    rootPublicKey,
    rootKeyId: anchor.key_id,
    minimumBundleSequence: minSeq,
  };
}
