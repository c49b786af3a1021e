import type { RouteCase } from "./route-table.ts";

/**
 * The routes of a product's settings (integration config, sealed files, browser runtime, trial
 * sign-up); route-table.ts lists them with all the others.
 */
export const PRODUCT_SETTING_ROUTES: RouteCase[] = [
  {
    method: "GET",
    path: "/mgmt/v1/products/:id/integration-config",
    scope: "products:read",
    resource: "product",
    environmentScoped: true,
  },
  {
    method: "GET",
    path: "/mgmt/v1/products/:id/sealed-files",
    scope: "products:read",
    resource: "product",
    environmentScoped: true,
  },
  {
    method: "POST",
    path: "/mgmt/v1/products/:id/sealed-files",
    scope: "products:write",
    resource: "product",
    environmentScoped: true,
  },
  {
    method: "GET",
    path: "/mgmt/v1/products/:id/browser-runtime",
    scope: "products:read",
    resource: "product",
    environmentScoped: true,
  },
  {
    method: "PATCH",
    path: "/mgmt/v1/products/:id/browser-runtime",
    ifMatch: true,
    scope: "products:write",
    resource: "product",
    environmentScoped: true,
    body: () => ({ enabled: false }),
  },
  {
    method: "GET",
    path: "/mgmt/v1/products/:id/trial-signup",
    scope: "products:read",
    resource: "product",
    environmentScoped: true,
  },
  {
    method: "PATCH",
    path: "/mgmt/v1/products/:id/trial-signup",
    ifMatch: true,
    scope: "products:write",
    resource: "product",
    environmentScoped: true,
    body: (ids) => ({ policy_id: ids.trialPolicyId, daily_limit: 10 }),
  },
];
