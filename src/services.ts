import type { Deps } from "./deps.ts";
import type { Environment } from "./domain/scopes.ts";
import { DeviceProofVerifier } from "./http/device-proof.ts";
import { IdempotencyStore } from "./http/idempotency.ts";
import type { Logger } from "./http/logger.ts";
import { PageCursors } from "./http/pagination.ts";
import { RuntimeSigner } from "./http/signed-response.ts";
import { MailOutbox } from "./mail/outbox.ts";
import { RuntimeGate } from "./modules/activations/gate.ts";
import { ActivationManagementService } from "./modules/activations/management-service.ts";
import { ActivationService } from "./modules/activations/service.ts";
import { ApiKeyService } from "./modules/api-keys/service.ts";
import { ClaimService } from "./modules/billing/claims.ts";
import { BillingService } from "./modules/billing/service.ts";
import { BillingWebhookService } from "./modules/billing/webhook.ts";
import { CustomerService } from "./modules/customers/service.ts";
import { DeviceBlockService } from "./modules/device-blocks/service.ts";
import { EmailVerificationService } from "./modules/email-verifications/service.ts";
import { AuditService } from "./modules/events/service.ts";
import { LeaseRetention } from "./modules/leases/retention.ts";
import { LeaseService } from "./modules/leases/service.ts";
import { LicenseService } from "./modules/licenses/service.ts";
import { PasskeyService } from "./modules/named-users/passkeys.ts";
import { NamedUserService } from "./modules/named-users/service.ts";
import { TwoFactorService } from "./modules/named-users/two-factor.ts";
import { OfflinePackageService } from "./modules/offline/service.ts";
import { ActivationLicenses } from "./modules/plan/activation-licenses.ts";
import { ManagementQuota, RuntimeQuota } from "./modules/plan/quota.ts";
import { PlanReportService } from "./modules/plan/service.ts";
import { PlanCache, PlanGate } from "./modules/plan/terms.ts";
import { UsageMeter } from "./modules/plan/usage-meter.ts";
import { PolicyService } from "./modules/policies/service.ts";
import { BrowserOriginCache, BrowserRuntimeService } from "./modules/products/browser-runtime-service.ts";
import { ProductService } from "./modules/products/service.ts";
import { TrialSignupService } from "./modules/products/trial-signup-service.ts";
import { UsageReportService } from "./modules/reports/service.ts";
import { ResellerService } from "./modules/resellers/service.ts";
import { RuntimeEventService } from "./modules/runtime-events/service.ts";
import { SealedFileKeyService } from "./modules/sealed-files/key-release.ts";
import { SealedFileService } from "./modules/sealed-files/service.ts";
import { TrialVerificationService } from "./modules/trials/service.ts";
import { IntegrationConfigService } from "./modules/trust/integration-config.ts";
import { TrustService } from "./modules/trust/service.ts";
import { DeliveryLog } from "./modules/webhooks/deliveries.ts";
import { WebhookService } from "./modules/webhooks/service.ts";
import { WorkspaceService } from "./modules/workspace/service.ts";
import { GroupCommit } from "./store/group-commit.ts";

export interface ServiceOptions {
  /** The public URL: certificate issuer, integration config, error links. */
  baseUrl: string;
  /** Environments that offer sealed files (configuration); both when not given. */
  sealedFileEnvironments?: readonly Environment[];
  /** LICENSING_WEBHOOK_ALLOW_PRIVATE_NETWORKS: webhook URLs on loopback and private networks (and http) allowed. */
  webhookAllowPrivateNetworks?: boolean;
  /** Where services that report problems no request answers (a failed billing event) write. */
  logger?: Logger;
}

/** Every service, built once from the same deps. Constructing them prepares statements; nothing else. */
export function createServices(deps: Deps, options: ServiceOptions) {
  const workspace = new WorkspaceService(deps);
  const plan = () => workspace.plan();
  const trust = new TrustService(deps);
  const products = new ProductService(deps, (productId) => trust.provision(productId));
  const browserOrigins = new BrowserOriginCache(deps.sqlite, plan);
  const policies = new PolicyService(deps, products, plan);
  const customers = new CustomerService(deps);
  const licenses = new LicenseService(deps, products, policies, customers, plan);
  const deviceBlocks = new DeviceBlockService(deps);
  const runtimeEvents = new RuntimeEventService(deps);
  const idempotency = new IdempotencyStore(deps.sqlite, deps.clock, deps.secrets);
  const usageMeter = new UsageMeter(deps.sqlite, deps.clock);
  // Read by every request (402, monthly allowances): cached, not a store read each time.
  const planCache = new PlanCache(workspace);
  const cachedPlan = () => planCache.current().plan;
  // Device calls of one event-loop turn share a commit (the server's WAL restart holds it too).
  const groupCommit = new GroupCommit(deps.sqlite);
  const runtimeGate = new RuntimeGate(
    deps,
    deviceBlocks,
    runtimeEvents,
    new DeviceProofVerifier(deps.sqlite),
    groupCommit,
  );
  const activations = new ActivationService(deps, trust, licenses, runtimeGate, idempotency, options.baseUrl);
  const sealedFiles = new SealedFileService(deps, products, plan, options.sealedFileEnvironments);
  const trialSignups = new TrialSignupService(deps, products, policies, plan);
  const mail = new MailOutbox(deps);
  const namedUsers = new NamedUserService(deps);
  const passkeys = new PasskeyService(deps, namedUsers, options.baseUrl, plan);
  const twoFactor = new TwoFactorService(deps, namedUsers, passkeys);
  const billing = new BillingService(deps, plan, options.baseUrl);
  const billingClaims = new ClaimService(deps);
  const webhooks = new WebhookService(deps, {
    allowPrivateNetworks: options.webhookAllowPrivateNetworks ?? false,
  });
  return {
    deps,
    groupCommit,
    apiKeys: new ApiKeyService(deps),
    workspace,
    audit: new AuditService(deps),
    idempotency,
    /** Every list's cursors: signed and bound to their listing (docs/api.md "Pagination"). */
    pages: new PageCursors(deps.secrets),
    trust,
    signer: new RuntimeSigner(trust, deps.clock),
    integrationConfig: new IntegrationConfigService(deps, products, trust, options.baseUrl),
    products,
    policies,
    customers,
    licenses,
    resellers: new ResellerService(deps),
    usageMeter,
    managementQuota: new ManagementQuota(usageMeter, cachedPlan),
    runtimeQuota: new RuntimeQuota(usageMeter, cachedPlan),
    planGate: new PlanGate(planCache),
    activationLicenses: new ActivationLicenses(deps.sqlite),
    planReport: new PlanReportService(deps, () => workspace.terms(), usageMeter),
    usageReport: new UsageReportService(deps),
    deviceBlocks,
    runtimeEvents,
    activations,
    activationAdmin: new ActivationManagementService(deps, licenses, activations),
    runtimeGate,
    leases: new LeaseService(deps, runtimeGate, activations),
    leaseRetention: new LeaseRetention(deps),
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
    sealedFileKeys: new SealedFileKeyService(runtimeGate, activations, sealedFiles, plan),
    browserOrigins,
    browserRuntime: new BrowserRuntimeService(deps, products, plan, browserOrigins),
    trialSignups,
    trials: new TrialVerificationService(
      deps,
      trialSignups,
      licenses,
      activations,
      runtimeGate,
      idempotency,
      trust,
      mail,
    ),
    mail,
    namedUsers,
    twoFactor,
    passkeys,
    emailVerifications: new EmailVerificationService(
      deps,
      licenses,
      namedUsers,
      twoFactor,
      passkeys,
      mail,
      plan,
    ),
    webhooks,
    webhookDeliveries: new DeliveryLog(deps, webhooks),
    billing,
    billingClaims,
    billingWebhooks: new BillingWebhookService(
      deps,
      billing,
      billingClaims,
      licenses,
      customers,
      products,
      plan,
      mail,
      options.logger,
    ),
  };
}

export type Services = ReturnType<typeof createServices>;
