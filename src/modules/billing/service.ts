import { Value } from "@sinclair/typebox/value";
import { and, asc, eq } from "drizzle-orm";
import type { Deps } from "../../deps.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import type { Environment } from "../../domain/scopes.ts";
import { BILLING_WEBHOOK_PATH } from "../../http/body.ts";
import { ApiError } from "../../http/errors.ts";
import { NameField } from "../../http/schemas.ts";
import type { Db } from "../../store/db.ts";
import {
  type Actor,
  billingIntegrations,
  billingOfferings,
  policies,
  products,
} from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import { failureStatus } from "./failures.ts";
import type { BillingIntegrationView } from "./model.ts";

export type IntegrationRow = typeof billingIntegrations.$inferSelect;
export type OfferingRow = typeof billingOfferings.$inferSelect;

export const DEFAULT_API_BASE_URL = "https://api.stripe.com";
/** Where the provider posts events (its body limit and early refusals key on the same path). */
export const WEBHOOK_PATH = BILLING_WEBHOOK_PATH;
export const CLAIM_PATH = "/billing/v1/claims";
export const CLAIM_REDEEM_PATH = `${CLAIM_PATH}/redeem`;

/** The exact path (a trailing slash is the same route to the router), nothing under it. */
export const isClaimRedeemPath = (path: string): boolean =>
  path === CLAIM_REDEEM_PATH || path === `${CLAIM_REDEEM_PATH}/`;

export const apiKeyContext = (environment: Environment) => `billing-api-key:${environment}`;
const webhookSecretContext = (environment: Environment) => `billing-webhook-secret:${environment}`;

/** Restricted (`rk_`) or secret (`sk_`) keys name their mode; the mode picks the environment. */
const API_KEY = /^(rk|sk)_(live|test)_[A-Za-z0-9]{8,250}$/;
const WEBHOOK_SECRET = /^whsec_[A-Za-z0-9+/=_-]{16,250}$/;
export const PRICE_ID = /^price_[A-Za-z0-9]{1,250}$/;

export const planLacksBilling = () =>
  new ApiError("PLAN_ENTITLEMENT_REQUIRED", "The workspace plan does not include the billing integration.", {
    entitlement: "billing_integration",
  });

export interface ConfigureInput {
  provider: "stripe";
  apiKey: string;
  webhookSecret: string;
  claimUrlBase?: string;
  apiBaseUrl?: string;
  secureClaims: boolean;
}

export interface OfferingInput {
  priceId: string;
  productId: string;
  policyId: string;
  name?: string;
  licenseDurationDays?: number;
}

/**
 * What keeps a value from being a base URL (an absolute http(s) URL without query, fragment or
 * userinfo), or null: exported so the command line refuses a bad flag before it reads any secret.
 */
export function baseUrlProblem(value: string): string | null {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return "must be an absolute http or https URL";
  }
  if ((url.protocol !== "https:" && url.protocol !== "http:") || url.search || url.hash || url.username) {
    return "must be an http(s) URL without query, fragment or userinfo";
  }
  return null;
}

/** The base URL kept without its trailing slash. */
function baseUrlOf(value: string, field: string): string {
  const problem = baseUrlProblem(value);
  if (problem !== null) throw ApiError.validation({ [field]: [problem] });
  return new URL(value).toString().replace(/(?<!\/)\/+$/, "");
}

/**
 * The API's rule for names (one line, 1-200 characters, no control characters): the Management
 * API shows an offering's name beside names that took that rule.
 */
const OFFERING_NAME = NameField();

/** What is wrong with an offering's name, or null when it is a valid one. */
export const offeringNameProblem = (name: string): string | null =>
  Value.Check(OFFERING_NAME, name) ? null : String(OFFERING_NAME["x-rule"]);

/**
 * The billing provider's configuration (from the command line), its offerings, and the status the
 * Management API reports. Secrets go in encrypted and come out only to verify and fetch.
 */
export class BillingService {
  constructor(
    private readonly deps: Pick<Deps, "db" | "clock" | "ids" | "secrets">,
    private readonly plan: () => PlanDefinition,
    private readonly baseUrl: string,
  ) {}

  integration(environment: Environment): IntegrationRow | undefined {
    return this.deps.db
      .select()
      .from(billingIntegrations)
      .where(eq(billingIntegrations.environment, environment))
      .get();
  }

  /** Active integrations with their webhook secrets, for verifying a delivery. */
  webhookSecrets(): { environment: Environment; secret: string }[] {
    return this.deps.db
      .select()
      .from(billingIntegrations)
      .where(eq(billingIntegrations.status, "active"))
      .all()
      .flatMap((row) =>
        row.webhookSecretCiphertext
          ? [
              {
                environment: row.environment,
                secret: this.deps.secrets.decrypt(
                  row.webhookSecretCiphertext,
                  webhookSecretContext(row.environment),
                ),
              },
            ]
          : [],
      );
  }

  apiKey(row: IntegrationRow): string | undefined {
    return row.apiKeyCiphertext
      ? this.deps.secrets.decrypt(row.apiKeyCiphertext, apiKeyContext(row.environment))
      : undefined;
  }

  /** Sets up (or replaces) the integration of the mode the API key belongs to. */
  configure(input: ConfigureInput, actor: Actor): IntegrationRow {
    if (!hasFeature(this.plan(), "billing_integration")) throw planLacksBilling();
    const mode = API_KEY.exec(input.apiKey)?.[2] as Environment | undefined;
    if (!mode) {
      throw ApiError.validation({
        api_key: ["must be a Stripe restricted key (rk_live_… or rk_test_…) or secret key (sk_…)"],
      });
    }
    if (!WEBHOOK_SECRET.test(input.webhookSecret))
      throw ApiError.validation({ webhook_secret: ["must be the endpoint's signing secret, whsec_…"] });
    const claimUrlBase = input.claimUrlBase ? baseUrlOf(input.claimUrlBase, "claim_url_base") : null;
    const apiBaseUrl = input.apiBaseUrl ? baseUrlOf(input.apiBaseUrl, "api_base_url") : DEFAULT_API_BASE_URL;
    const now = this.deps.clock.now();
    const current = this.integration(mode);
    const row: IntegrationRow = {
      environment: mode,
      provider: input.provider,
      status: "active",
      apiKeyCiphertext: this.deps.secrets.encrypt(input.apiKey, apiKeyContext(mode)),
      webhookSecretCiphertext: this.deps.secrets.encrypt(input.webhookSecret, webhookSecretContext(mode)),
      apiBaseUrl,
      claimUrlBase,
      secureClaims: input.secureClaims,
      lastEventId: current?.lastEventId ?? null,
      lastEventType: current?.lastEventType ?? null,
      lastEventResult: current?.lastEventResult ?? null,
      lastEventReason: current?.lastEventReason ?? null,
      lastEventAt: current?.lastEventAt ?? null,
      lastFailureId: current?.lastFailureId ?? null,
      lastFailureType: current?.lastFailureType ?? null,
      lastFailureReason: current?.lastFailureReason ?? null,
      lastFailureAt: current?.lastFailureAt ?? null,
      createdAt: current?.createdAt ?? now,
      updatedAt: now,
    };
    this.deps.db.transaction((tx) => {
      tx.insert(billingIntegrations)
        .values(row)
        .onConflictDoUpdate({ target: billingIntegrations.environment, set: row })
        .run();
      recordAudit(
        tx,
        this.deps,
        { actor, environment: mode, requestId: null },
        {
          type: "billing_integration.configured",
          target: { type: "billing_integration", id: mode },
          data: { provider: input.provider, secure_claims: input.secureClaims, claim_url_base: claimUrlBase },
        },
      );
    });
    return row;
  }

  /** Stops receiving events and forgets both secrets. Returns the environments it disabled. */
  disable(environment: Environment | undefined, actor: Actor): Environment[] {
    const rows = this.deps.db
      .select()
      .from(billingIntegrations)
      .where(
        and(
          eq(billingIntegrations.status, "active"),
          environment ? eq(billingIntegrations.environment, environment) : undefined,
        ),
      )
      .all();
    const now = this.deps.clock.now();
    this.deps.db.transaction((tx) => {
      for (const row of rows) {
        tx.update(billingIntegrations)
          .set({ status: "disabled", apiKeyCiphertext: null, webhookSecretCiphertext: null, updatedAt: now })
          .where(eq(billingIntegrations.environment, row.environment))
          .run();
        recordAudit(
          tx,
          this.deps,
          { actor, environment: row.environment, requestId: null },
          {
            type: "billing_integration.disabled",
            target: { type: "billing_integration", id: row.environment },
          },
        );
      }
    });
    return rows.map((row) => row.environment);
  }

  /** The offering's environment is its product's, so a test price can only ever make test licenses. */
  addOffering(input: OfferingInput, actor: Actor): OfferingRow {
    if (!hasFeature(this.plan(), "billing_integration")) throw planLacksBilling();
    if (!PRICE_ID.test(input.priceId)) throw ApiError.validation({ price: ["must be a price id, price_…"] });
    const nameProblem = input.name === undefined ? null : offeringNameProblem(input.name);
    if (nameProblem) throw ApiError.validation({ name: [nameProblem] });
    const product = this.deps.db.select().from(products).where(eq(products.id, input.productId)).get();
    // Each message reads after its field's name ("product prod_… does not exist"), as the command
    // line shows them; the value is named, as the operator typed it.
    if (!product) throw ApiError.validation({ product: [`${input.productId} does not exist`] });
    if (product.status === "archived") throw ApiError.validation({ product: ["is archived"] });
    const policy = this.deps.db.select().from(policies).where(eq(policies.id, input.policyId)).get();
    if (!policy || policy.productId !== product.id)
      throw ApiError.validation({ policy: [`${input.policyId} is not a policy of ${product.id}`] });
    if (policy.status === "retired") throw ApiError.validation({ policy: ["is retired"] });
    if (
      input.licenseDurationDays !== undefined &&
      (!Number.isSafeInteger(input.licenseDurationDays) ||
        input.licenseDurationDays < 1 ||
        input.licenseDurationDays * 86_400 > this.plan().license_duration_max_sec)
    ) {
      throw ApiError.validation({
        duration_days: ["must be a whole number of days within the plan's longest license"],
      });
    }
    if (this.activeOffering(product.environment, input.priceId)) {
      throw ApiError.validation({
        price: [`already has an active offering in ${product.environment}; remove it first`],
      });
    }
    const now = this.deps.clock.now();
    const row: OfferingRow = {
      id: `bof_${this.deps.ids.ulid(now.getTime())}`,
      environment: product.environment,
      priceId: input.priceId,
      name: input.name ?? null,
      productId: product.id,
      policyId: policy.id,
      licenseDurationDays: input.licenseDurationDays ?? null,
      status: "active",
      createdAt: now,
      updatedAt: now,
    };
    this.deps.db.transaction((tx) => {
      tx.insert(billingOfferings).values(row).run();
      this.auditOffering(tx, row, actor, "billing_offering.created");
    });
    return row;
  }

  /** By offering id or price id; true when one was removed. */
  removeOffering(idOrPrice: string, actor: Actor): OfferingRow | undefined {
    const row = this.offerings().find(
      (offering) =>
        offering.status === "active" && (offering.id === idOrPrice || offering.priceId === idOrPrice),
    );
    if (!row) return undefined;
    const now = this.deps.clock.now();
    this.deps.db.transaction((tx) => {
      tx.update(billingOfferings)
        .set({ status: "removed", updatedAt: now })
        .where(eq(billingOfferings.id, row.id))
        .run();
      this.auditOffering(tx, row, actor, "billing_offering.removed");
    });
    return { ...row, status: "removed", updatedAt: now };
  }

  offerings(environment?: Environment): OfferingRow[] {
    return this.deps.db
      .select()
      .from(billingOfferings)
      .where(environment ? eq(billingOfferings.environment, environment) : undefined)
      .orderBy(asc(billingOfferings.id))
      .all();
  }

  activeOffering(environment: Environment, priceId: string): OfferingRow | undefined {
    return this.deps.db
      .select()
      .from(billingOfferings)
      .where(
        and(
          eq(billingOfferings.environment, environment),
          eq(billingOfferings.priceId, priceId),
          eq(billingOfferings.status, "active"),
        ),
      )
      .get();
  }

  claimUrl(row: IntegrationRow | undefined): string | null {
    if (row?.status !== "active") return null;
    return `${row.claimUrlBase ?? this.baseUrl}${CLAIM_PATH}`;
  }

  /** Spec §2.4 "Billing integration status", for the caller's environment. */
  status(environment: Environment): BillingIntegrationView {
    const row = this.integration(environment);
    const entitled = hasFeature(this.plan(), "billing_integration");
    const status = !row
      ? "not_configured"
      : row.status === "disabled"
        ? "disabled"
        : entitled
          ? "active"
          : "not_entitled";
    return {
      registered: row?.status === "active",
      provider: row?.provider ?? null,
      mode: environment,
      status,
      secure_claims_required: row?.secureClaims ?? true,
      license_claim_url: this.claimUrl(row),
      webhook_url: `${this.baseUrl}${WEBHOOK_PATH}`,
      last_event:
        row?.lastEventId && row.lastEventType && row.lastEventResult && row.lastEventAt
          ? {
              id: row.lastEventId,
              type: row.lastEventType,
              result: row.lastEventResult as "succeeded" | "ignored" | "failed",
              reason: row.lastEventReason,
              at: row.lastEventAt.toISOString(),
            }
          : null,
      ...failureStatus(this.deps.db, environment, row),
      offerings: this.offerings(environment).map(presentOffering),
    };
  }

  private auditOffering(tx: Pick<Db, "insert">, row: OfferingRow, actor: Actor, type: string): void {
    recordAudit(
      tx,
      this.deps,
      { actor, environment: row.environment, requestId: null },
      {
        type,
        target: { type: "billing_offering", id: row.id },
        data: { price_id: row.priceId, product_id: row.productId, policy_id: row.policyId },
      },
    );
  }
}

export function presentOffering(row: OfferingRow) {
  return {
    id: row.id,
    name: row.name,
    billing_price_id: row.priceId,
    product_id: row.productId,
    policy_id: row.policyId,
    status: row.status,
    license_duration_days: row.licenseDurationDays,
  };
}
