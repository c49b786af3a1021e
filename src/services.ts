import type { Deps } from "./deps.ts";
import { IdempotencyStore } from "./http/idempotency.ts";
import { ApiKeyService } from "./modules/api-keys/service.ts";
import { CustomerService } from "./modules/customers/service.ts";
import { AuditService } from "./modules/events/service.ts";
import { LicenseService } from "./modules/licenses/service.ts";
import { PlanReportService } from "./modules/plan/service.ts";
import { PolicyService } from "./modules/policies/service.ts";
import { ProductService } from "./modules/products/service.ts";
import { UsageReportService } from "./modules/reports/service.ts";
import { ResellerService } from "./modules/resellers/service.ts";
import { WorkspaceService } from "./modules/workspace/service.ts";

/** Every service, built once from the same deps. Constructing them prepares statements; nothing else. */
export function createServices(deps: Deps) {
  const workspace = new WorkspaceService(deps);
  const plan = () => workspace.plan();
  const products = new ProductService(deps);
  const policies = new PolicyService(deps, products, plan);
  const customers = new CustomerService(deps);
  return {
    deps,
    apiKeys: new ApiKeyService(deps),
    workspace,
    audit: new AuditService(deps),
    idempotency: new IdempotencyStore(deps.sqlite, deps.clock),
    products,
    policies,
    customers,
    licenses: new LicenseService(deps, products, policies, customers, plan),
    resellers: new ResellerService(deps),
    planReport: new PlanReportService(deps, plan),
    usageReport: new UsageReportService(deps),
  };
}

export type Services = ReturnType<typeof createServices>;
