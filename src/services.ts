import type { Deps } from "./deps.ts";
import { IdempotencyStore } from "./http/idempotency.ts";
import { ApiKeyService } from "./modules/api-keys/service.ts";
import { AuditService } from "./modules/events/service.ts";
import { ProductService } from "./modules/products/service.ts";
import { WorkspaceService } from "./modules/workspace/service.ts";

/** Every service, built once from the same deps. Constructing them prepares statements; nothing else. */
export function createServices(deps: Deps) {
  const workspace = new WorkspaceService(deps);
  return {
    deps,
    apiKeys: new ApiKeyService(deps),
    workspace,
    audit: new AuditService(deps),
    idempotency: new IdempotencyStore(deps.sqlite, deps.clock),
    products: new ProductService(deps),
  };
}

export type Services = ReturnType<typeof createServices>;
