import type { Scope } from "../../src/domain/scopes.ts";
import { factories } from "../support/factories.ts";
import type { TestContext } from "../support/harness.ts";
import { seedNamedUser } from "../support/named-users.ts";
import { seedWebhook } from "../support/webhooks.ts";
import { NAMED_USER_ROUTES } from "./route-table-named-users.ts";
import { PRODUCT_SETTING_ROUTES } from "./route-table-product-settings.ts";

export type Resource =
  | "product"
  | "policy"
  | "customer"
  | "license"
  | "reseller"
  | "activation"
  | "block"
  | "webhook"
  | "licenseUser"
  | "assignment";

export interface RouteCase {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  /** The route template as Elysia registers it (`:id`). */
  path: string;
  scope: Scope;
  /** What `:id` refers to; the shared suite makes one in each environment. */
  resource?: Resource;
  /** Environment-scoped resources are invisible to the other environment's keys (404). */
  environmentScoped?: boolean;
  /** Whether the route takes an Idempotency-Key, and whether it must. */
  idempotency?: "required" | "optional";
  /** A body the route accepts, so an added unknown field is the only thing wrong. */
  body?: (ids: Ids) => Record<string, unknown>;
  /** Another valid body, for idempotency conflicts; defaults to the body with another `name`. */
  variant?: (ids: Ids) => Record<string, unknown>;
  /** The route changes its resource's ETag, so it honours If-Match (docs/api.md "If-Match and ETag"). */
  ifMatch?: true;
  /** The route deletes a resource without an ETag: it parses If-Match, and only `*` matches. */
  noEtag?: true;
  /** A list: the prefix of its rows' ids, and `oldest` for the oldest-first one (docs/api.md "Pagination"). */
  list?: { idPrefix: string; order?: "oldest" };
}

/** Where each resource with an ETag is read back: the detail route whose ETag If-Match names. */
export const ETAG_SOURCES: Partial<Record<Resource, string>> = {
  product: "/mgmt/v1/products/:id",
  policy: "/mgmt/v1/policies/:id",
  customer: "/mgmt/v1/customers/:id",
  license: "/mgmt/v1/licenses/:id",
  reseller: "/mgmt/v1/resellers/:id",
  webhook: "/mgmt/v1/webhooks/:id",
  licenseUser: "/mgmt/v1/license-users/:id",
};

export type Ids = Record<Resource, string> & { productId: string; policyId: string; trialPolicyId: string };

/** Every management route with its scope. The suite fails if the app has a route missing here. */
export const MANAGEMENT_ROUTES: RouteCase[] = [
  { method: "GET", path: "/mgmt/v1/products", scope: "products:read", list: { idPrefix: "prod" } },
  {
    method: "POST",
    path: "/mgmt/v1/products",
    scope: "products:write",
    idempotency: "required",
    body: () => ({ name: "P", code: "p-new", environment: "live" }),
  },
  {
    method: "GET",
    path: "/mgmt/v1/products/:id",
    scope: "products:read",
    resource: "product",
    environmentScoped: true,
  },
  {
    method: "PATCH",
    path: "/mgmt/v1/products/:id",
    ifMatch: true,
    scope: "products:write",
    resource: "product",
    environmentScoped: true,
    body: () => ({ name: "Renamed" }),
  },
  {
    method: "DELETE",
    path: "/mgmt/v1/products/:id",
    ifMatch: true,
    scope: "products:write",
    resource: "product",
    environmentScoped: true,
  },
  { method: "GET", path: "/mgmt/v1/policies", scope: "policies:read", list: { idPrefix: "pol" } },
  {
    method: "POST",
    path: "/mgmt/v1/policies",
    scope: "policies:write",
    idempotency: "required",
    body: (ids) => ({ product_id: ids.productId, name: "Pol" }),
  },
  {
    method: "GET",
    path: "/mgmt/v1/policies/:id",
    scope: "policies:read",
    resource: "policy",
    environmentScoped: true,
  },
  {
    method: "PATCH",
    path: "/mgmt/v1/policies/:id",
    ifMatch: true,
    scope: "policies:write",
    resource: "policy",
    environmentScoped: true,
    body: () => ({ name: "Renamed" }),
  },
  {
    method: "DELETE",
    path: "/mgmt/v1/policies/:id",
    ifMatch: true,
    scope: "policies:write",
    resource: "policy",
    environmentScoped: true,
  },
  { method: "GET", path: "/mgmt/v1/customers", scope: "customers:read", list: { idPrefix: "cus" } },
  {
    method: "POST",
    path: "/mgmt/v1/customers",
    scope: "customers:write",
    idempotency: "required",
    body: () => ({ name: "C" }),
  },
  { method: "GET", path: "/mgmt/v1/customers/:id", scope: "customers:read", resource: "customer" },
  {
    method: "PATCH",
    path: "/mgmt/v1/customers/:id",
    ifMatch: true,
    scope: "customers:write",
    resource: "customer",
    body: () => ({ notes: "n" }),
  },
  {
    method: "DELETE",
    path: "/mgmt/v1/customers/:id",
    scope: "customers:write",
    resource: "customer",
    ifMatch: true,
  },
  { method: "GET", path: "/mgmt/v1/licenses", scope: "licenses:read", list: { idPrefix: "lic" } },
  {
    method: "POST",
    path: "/mgmt/v1/licenses",
    scope: "licenses:write",
    idempotency: "required",
    body: (ids) => ({ product_id: ids.productId, policy_id: ids.policyId }),
    variant: (ids) => ({ product_id: ids.productId, policy_id: ids.policyId, metadata: { v: 2 } }),
  },
  {
    method: "GET",
    path: "/mgmt/v1/licenses/:id",
    scope: "licenses:read",
    resource: "license",
    environmentScoped: true,
  },
  {
    method: "PATCH",
    path: "/mgmt/v1/licenses/:id",
    ifMatch: true,
    scope: "licenses:write",
    resource: "license",
    environmentScoped: true,
    body: () => ({ metadata: { a: 1 } }),
  },
  {
    method: "DELETE",
    path: "/mgmt/v1/licenses/:id",
    ifMatch: true,
    scope: "licenses:write",
    resource: "license",
    environmentScoped: true,
  },
  {
    method: "POST",
    path: "/mgmt/v1/licenses/:id/convert-trial",
    ifMatch: true,
    scope: "licenses:write",
    resource: "license",
    environmentScoped: true,
    body: (ids) => ({ target_policy_id: ids.policyId }),
  },
  { method: "GET", path: "/mgmt/v1/resellers", scope: "customers:read", list: { idPrefix: "rsl" } },
  {
    method: "POST",
    path: "/mgmt/v1/resellers",
    scope: "customers:write",
    idempotency: "optional",
    body: () => ({ name: "R" }),
  },
  { method: "GET", path: "/mgmt/v1/resellers/:id", scope: "customers:read", resource: "reseller" },
  {
    method: "PATCH",
    path: "/mgmt/v1/resellers/:id",
    ifMatch: true,
    scope: "customers:write",
    resource: "reseller",
    body: () => ({ name: "R2" }),
  },
  { method: "GET", path: "/mgmt/v1/events", scope: "events:read", list: { idPrefix: "evt" } },
  { method: "GET", path: "/mgmt/v1/webhooks", scope: "webhooks:read", list: { idPrefix: "whk" } },
  {
    method: "POST",
    path: "/mgmt/v1/webhooks",
    scope: "webhooks:write",
    idempotency: "optional",
    body: () => ({ url: "https://receiver.example.com/hook", events: ["*"] }),
  },
  { method: "GET", path: "/mgmt/v1/webhooks/:id", scope: "webhooks:read", resource: "webhook" },
  {
    method: "PATCH",
    path: "/mgmt/v1/webhooks/:id",
    ifMatch: true,
    scope: "webhooks:write",
    resource: "webhook",
    body: () => ({ name: "Renamed" }),
  },
  {
    method: "DELETE",
    path: "/mgmt/v1/webhooks/:id",
    scope: "webhooks:write",
    resource: "webhook",
    ifMatch: true,
  },
  {
    method: "POST",
    path: "/mgmt/v1/webhooks/:id/rotate-secret",
    ifMatch: true,
    scope: "webhooks:write",
    resource: "webhook",
    body: () => ({ overlap_sec: 60 }),
  },
  {
    method: "GET",
    path: "/mgmt/v1/webhooks/:id/deliveries",
    scope: "webhooks:read",
    resource: "webhook",
    list: { idPrefix: "whd" },
  },
  {
    method: "GET",
    path: "/mgmt/v1/webhooks/:id/deliveries/:delivery_id",
    scope: "webhooks:read",
    resource: "webhook",
  },
  {
    method: "POST",
    path: "/mgmt/v1/webhooks/:id/deliveries/:delivery_id/replay",
    scope: "webhooks:write",
    resource: "webhook",
  },
  { method: "GET", path: "/mgmt/v1/billing-integration", scope: "products:read" },
  {
    method: "GET",
    path: "/mgmt/v1/licenses/:id/activations",
    list: { idPrefix: "act" },
    scope: "licenses:read",
    resource: "license",
    environmentScoped: true,
  },
  {
    method: "GET",
    path: "/mgmt/v1/activations/:id",
    scope: "licenses:read",
    resource: "activation",
    environmentScoped: true,
  },
  {
    method: "DELETE",
    path: "/mgmt/v1/activations/:id",
    scope: "activations:delete",
    resource: "activation",
    environmentScoped: true,
    noEtag: true,
  },
  {
    method: "GET",
    path: "/mgmt/v1/runtime_events",
    scope: "licenses:read",
    list: { idPrefix: "evt", order: "oldest" },
  },
  { method: "GET", path: "/mgmt/v1/device-blocks", scope: "licenses:read", list: { idPrefix: "blk" } },
  {
    method: "POST",
    path: "/mgmt/v1/device-blocks",
    scope: "licenses:write",
    body: (ids) => ({ kind: "license", license_id: ids.license }),
  },
  {
    method: "DELETE",
    path: "/mgmt/v1/device-blocks/:id",
    scope: "licenses:write",
    resource: "block",
    environmentScoped: true,
    noEtag: true,
  },
  {
    method: "POST",
    path: "/mgmt/v1/licenses/:id/offline-certificates",
    scope: "licenses:write",
    resource: "license",
    environmentScoped: true,
    // Valid for the schema only: the suite's checks all answer before the device proof is read.
    body: (ids) => ({
      request: {
        format: "service-offline-request-v1",
        product_id: ids.productId,
        device_signing_public_key: "ed25519:placeholder",
        device_kem_public_key: "p256:placeholder",
        device_proof: "placeholder",
        machine_info: { os: "linux", arch: "x64" },
        nonce: "n".repeat(22),
        generated_at: 0,
      },
    }),
  },
  ...PRODUCT_SETTING_ROUTES,
  { method: "GET", path: "/mgmt/v1/plan", scope: "reports:read" },
  { method: "GET", path: "/mgmt/v1/reports/usage", scope: "reports:read" },
  ...NAMED_USER_ROUTES,
];

/** One of each resource per environment; the live ids are what the routes are called with. */
export function seedResources(t: TestContext): { live: Ids; test: Ids } {
  const f = factories(t);
  const seed = (environment: "live" | "test"): Ids => {
    const { product, policy } = f.catalog(environment);
    const trialPolicy = f.policy({ productId: product.id, environment, licenseType: "trial", trialDays: 14 });
    const customer = f.customer();
    const trial = f.license({
      productId: product.id,
      policyId: trialPolicy.id,
      environment,
      licenseType: "trial",
      customerId: environment === "test" ? customer.id : null,
    });
    const reseller = f.reseller();
    const activation = f.activation({ productId: product.id, licenseId: trial.row.id, environment });
    const block = f.deviceBlock({ environment, target: trial.row.id });
    const webhook = seedWebhook(t);
    const named = seedNamedUser(t, environment, trial.row.id);
    return {
      product: product.id,
      policy: policy.id,
      customer: customer.id,
      license: trial.row.id,
      reseller: reseller.id,
      activation: activation.id,
      block: block.id,
      webhook,
      licenseUser: named.userId,
      assignment: named.assignmentId,
      productId: product.id,
      policyId: policy.id,
      trialPolicyId: trialPolicy.id,
    };
  };
  return { live: seed("live"), test: seed("test") };
}

export const concretePath = (route: RouteCase, id: string) => route.path.replace(":id", id);
