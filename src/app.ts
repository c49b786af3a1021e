import { type AnyElysia, Elysia } from "elysia";
import type { Deps } from "./deps.ts";
import type { Environment } from "./domain/scopes.ts";
import { scopeRegistry } from "./http/auth.ts";
import { bodylessRoutes } from "./http/body.ts";
import { httpConventions } from "./http/conventions.ts";
import { deviceProofRoutes, runtimeCors } from "./http/cors.ts";
import { type Logger, silentLogger } from "./http/logger.ts";
import type { Metrics } from "./http/metrics.ts";
import { pagedRoutes } from "./http/pagination.ts";
import {
  DEFAULT_RUNTIME_RATE_LIMITS,
  GcraLimiter,
  type RateLimitPolicy,
  type RuntimeRateLimitSettings,
} from "./http/rate-limit.ts";
import { runtimeLimits } from "./http/runtime-limits.ts";
import { managementActivationsController } from "./modules/activations/management.ts";
import { runtimeActivationsController } from "./modules/activations/runtime.ts";
import { billingIntegrationController, billingPublicController } from "./modules/billing/index.ts";
import { customersController } from "./modules/customers/index.ts";
import { deviceBlocksController } from "./modules/device-blocks/index.ts";
import { docsController } from "./modules/docs/index.ts";
import { buildOpenApiDocument } from "./modules/docs/openapi.ts";
import { emailVerificationsController } from "./modules/email-verifications/index.ts";
import { eventsController } from "./modules/events/index.ts";
import { healthController, type Readiness } from "./modules/health/index.ts";
import { leasesController } from "./modules/leases/index.ts";
import { licensesController } from "./modules/licenses/index.ts";
import { metricsController } from "./modules/metrics/index.ts";
import { namedUsersController } from "./modules/named-users/index.ts";
import { offlineController } from "./modules/offline/index.ts";
import { planController } from "./modules/plan/index.ts";
import { policiesController } from "./modules/policies/index.ts";
import { browserRuntimeController } from "./modules/products/browser-runtime.ts";
import { productsController } from "./modules/products/index.ts";
import { trialSignupController } from "./modules/products/trial-signup.ts";
import { reportsController } from "./modules/reports/index.ts";
import { resellersController } from "./modules/resellers/index.ts";
import { runtimeEventsController } from "./modules/runtime-events/index.ts";
import { sealedFilesController } from "./modules/sealed-files/index.ts";
import { sealedFileKeysController } from "./modules/sealed-files/runtime.ts";
import { trialVerificationsController } from "./modules/trials/index.ts";
import { runtimeTrustController } from "./modules/trust/index.ts";
import { integrationConfigController } from "./modules/trust/management.ts";
import { webhooksController } from "./modules/webhooks/index.ts";
import { createServices, type Services } from "./services.ts";

export interface AppOptions {
  baseUrl: string;
  /** Environments that offer sealed files; both when not given. */
  sealedFileEnvironments?: readonly Environment[];
  testClock?: boolean;
  logger?: Logger;
  readiness?: Readiness;
  managementRateLimit?: RateLimitPolicy;
  /** Runtime burst windows; DEFAULT_RUNTIME_RATE_LIMITS when not given. */
  runtimeRateLimits?: RuntimeRateLimitSettings;
  /** Take the client address from the last X-Forwarded-For entry (behind a reverse proxy). */
  trustForwardedFor?: boolean;
  /** Mounts GET /metrics behind this token; without it the route does not exist. */
  metrics?: { registry: Metrics; token: string };
  /** Webhook URLs on loopback and private networks (and over http) are accepted. */
  webhookAllowPrivateNetworks?: boolean;
}

export const DEFAULT_MANAGEMENT_RATE_LIMIT: RateLimitPolicy = { name: "mgmt", limit: 100, windowSec: 1 };

/** Builds the HTTP application. Starts nothing: no listen, no migration, no timers. */
export function createApp(
  deps: Deps,
  options: AppOptions,
  services: Services = createServices(deps, options),
) {
  // The document describes the finished app, so it is built on first request, not here.
  let openApiCache: Record<string, unknown> | undefined;
  const root: { app?: AnyElysia } = {};
  let scopes: ReturnType<typeof scopeRegistry> | undefined;
  let paged: ReturnType<typeof pagedRoutes> | undefined;
  let bodyless: ReturnType<typeof bodylessRoutes> | undefined;
  let proofRoutes: ReturnType<typeof deviceProofRoutes> | undefined;
  const openApiDocument = () => {
    if (!root.app) throw new Error("the app is not built yet");
    openApiCache ??= buildOpenApiDocument(root.app, options.baseUrl);
    return openApiCache;
  };
  // standardHostname off: Elysia otherwise finds the path by skipping 11 characters, which under
  // a host name of fewer than 4 (Host: api) starts inside the path and routes the request
  // elsewhere. Every hook decides on the path Elysia routes on (its `path`), never on its own
  // reading of the URL (test/api/request-paths.test.ts).
  const app = new Elysia({ normalize: false, handler: { standardHostname: false } })
    // First: a preflight is answered before the conventions count, limit or authenticate anything.
    .use(
      runtimeCors(
        services.browserOrigins,
        () => deps.ids.next("request", deps.clock.now().getTime()),
        (method, route) => {
          proofRoutes ??= root.app ? deviceProofRoutes(root.app.routes) : undefined;
          return proofRoutes?.(method, route) ?? false;
        },
      ),
    )
    .use(
      httpConventions({
        clock: deps.clock,
        ids: deps.ids,
        apiKeys: services.apiKeys,
        logger: options.logger ?? silentLogger,
        managementLimiter: new GcraLimiter(options.managementRateLimit ?? DEFAULT_MANAGEMENT_RATE_LIMIT),
        managementQuota: services.managementQuota,
        planGate: services.planGate,
        baseUrl: options.baseUrl,
        testClock: options.testClock ?? false,
        trustForwardedFor: options.trustForwardedFor ?? false,
        requiredScope: (method, route) => {
          scopes ??= root.app ? scopeRegistry(root.app.routes) : undefined;
          return scopes?.(method, route);
        },
        bodylessRoute: (method, route) => {
          bodyless ??= root.app ? bodylessRoutes(root.app.routes) : undefined;
          return bodyless?.(method, route) ?? false;
        },
        pagedRoute: (method, route) => {
          paged ??= root.app ? pagedRoutes(root.app.routes) : undefined;
          return paged?.(method, route) ?? false;
        },
        signDenial: (signedFor, requestId, status, error) =>
          services.signer.signature(signedFor, requestId, status, error),
      }),
    )
    // After the conventions (request id, error envelope), before any route.
    .use(
      runtimeLimits({
        clock: deps.clock,
        limits: options.runtimeRateLimits ?? DEFAULT_RUNTIME_RATE_LIMITS,
        trustForwardedFor: options.trustForwardedFor ?? false,
        planGate: services.planGate,
        quota: services.runtimeQuota,
        licenseOf: (activationId) => services.activationLicenses.licenseOf(activationId),
      }),
    )
    .use(healthController(options.readiness ?? { ready: () => true }))
    .use(
      options.metrics
        ? metricsController(options.metrics.registry, options.metrics.token)
        : new Elysia({ name: "metrics-off" }),
    )
    .use(docsController(openApiDocument))
    .use(productsController(services))
    .use(browserRuntimeController(services))
    .use(policiesController(services))
    .use(customersController(services))
    .use(licensesController(services))
    .use(resellersController(services))
    .use(eventsController(services))
    .use(webhooksController(services))
    .use(planController(services))
    .use(reportsController(services))
    .use(integrationConfigController(services))
    .use(billingIntegrationController(services))
    .use(billingPublicController(services))
    .use(managementActivationsController(services))
    .use(namedUsersController(services))
    .use(runtimeEventsController(services))
    .use(deviceBlocksController(services))
    .use(runtimeTrustController(services))
    .use(runtimeActivationsController(services))
    .use(emailVerificationsController(services))
    .use(leasesController(services))
    .use(offlineController(services))
    .use(sealedFilesController(services))
    .use(sealedFileKeysController(services))
    .use(trialSignupController(services))
    .use(trialVerificationsController(services));
  root.app = app;
  return app;
}

export type App = ReturnType<typeof createApp>;
