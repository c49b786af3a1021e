import type { Deps } from "./deps.ts";
import type { Environment } from "./domain/scopes.ts";
import { DeviceProofVerifier } from "./http/device-proof.ts";
import { IdempotencyStore } from "./http/idempotency.ts";
import { RuntimeSigner } from "./http/signed-response.ts";
import { MailOutbox } from "./mail/outbox.ts";
import { RuntimeGate } from "./modules/activations/gate.ts";
import { ActivationManagementService } from "./modules/activations/management-service.ts";
import { ActivationService } from "./modules/activations/service.ts";
import { ApiKeyService } from "./modules/api-keys/service.ts";
import { CustomerService } from "./modules/customers/service.ts";
import { DeviceBlockService } from "./modules/device-blocks/service.ts";
import { AuditService } from "./modules/events/service.ts";
import { LeaseService } from "./modules/leases/service.ts";
import { LicenseService } from "./modules/licenses/service.ts";
import { OfflinePackageService } from "./modules/offline/service.ts";
import { ManagementQuota } from "./modules/plan/quota.ts";
import { PlanReportService } from "./modules/plan/service.ts";
import { UsageMeter } from "./modules/plan/usage-meter.ts";
import { PolicyService } from "./modules/policies/service.ts";
import { ProductService } from "./modules/products/service.ts";
import { UsageReportService } from "./modules/reports/service.ts";
import { ResellerService } from "./modules/resellers/service.ts";
import { RuntimeEventService } from "./modules/runtime-events/service.ts";
import { SealedFileKeyService } from "./modules/sealed-files/key-release.ts";
import { SealedFileService } from "./modules/sealed-files/service.ts";
import { IntegrationConfigService } from "./modules/trust/integration-config.ts";
import { TrustService } from "./modules/trust/service.ts";
import { WorkspaceService } from "./modules/workspace/service.ts";

export interface ServiceOptions {
  /** The public URL: certificate issuer, integration config, error links. */
  baseUrl: string;
  /** Environments that offer sealed files (configuration); both when not given. */
  sealedFileEnvironments?: readonly Environment[];
}

/** Every service, built once from the same deps. Constructing them prepares statements; nothing else. */
export function createServices(deps: Deps, options: ServiceOptions) {
  const workspace = new WorkspaceService(deps);
  const plan = () => workspace.plan();
  const trust = new TrustService(deps);
  const products = new ProductService(deps, (productId) => trust.provision(productId));
  const policies = new PolicyService(deps, products, plan);
  const customers = new CustomerService(deps);
  const licenses = new LicenseService(deps, products, policies, customers, plan);
  const deviceBlocks = new DeviceBlockService(deps);
  const runtimeEvents = new RuntimeEventService(deps);
  const idempotency = new IdempotencyStore(deps.sqlite, deps.clock, deps.secrets);
  const usageMeter = new UsageMeter(deps.sqlite, deps.clock);
  const runtimeGate = new RuntimeGate(
    deps,
    deviceBlocks,
    runtimeEvents,
    new DeviceProofVerifier(deps.sqlite),
  );
  const activations = new ActivationService(deps, trust, licenses, runtimeGate, idempotency, options.baseUrl);
  const sealedFiles = new SealedFileService(deps, products, plan, options.sealedFileEnvironments);
  const mail = new MailOutbox(deps);
  return {
    deps,
    apiKeys: new ApiKeyService(deps),
    workspace,
    audit: new AuditService(deps),
    idempotency,
    trust,
    signer: new RuntimeSigner(trust, deps.clock),
    integrationConfig: new IntegrationConfigService(deps, products, trust, options.baseUrl),
    products,
    policies,
    customers,
    licenses,
    resellers: new ResellerService(deps),
    usageMeter,
    managementQuota: new ManagementQuota(usageMeter, plan),
    planReport: new PlanReportService(deps, plan, usageMeter),
    usageReport: new UsageReportService(deps),
    deviceBlocks,
    runtimeEvents,
    activations,
    activationAdmin: new ActivationManagementService(deps, licenses, activations),
    runtimeGate,
    leases: new LeaseService(deps, runtimeGate, activations),
    offlinePackages: new OfflinePackageService(
      deps,
      trust,
      licenses,
      runtimeGate,
      activations,
      plan,
      options.baseUrl,
    ),
    sealedFiles,
    sealedFileKeys: new SealedFileKeyService(runtimeGate, sealedFiles, plan),
    mail,
  };
}

export type Services = ReturnType<typeof createServices>;
