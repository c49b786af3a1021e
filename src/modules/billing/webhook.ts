import { and, eq } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import { defaultExpiry } from "../../domain/license-state.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import { type Logger, silentLogger } from "../../http/logger.ts";
import type { MailOutbox } from "../../mail/outbox.ts";
import type { Db } from "../../store/db.ts";
import { billingCheckouts, billingEvents, billingIntegrations, policies } from "../../store/schema/index.ts";
import type { CustomerService } from "../customers/service.ts";
import type { LicenseRow, LicenseService } from "../licenses/service.ts";
import { settingsOf } from "../policies/service.ts";
import type { ProductService } from "../products/service.ts";
import { customerForBuyer, readBuyer } from "./buyers.ts";
import type { ClaimService } from "./claims.ts";
import { recordFailure } from "./failures.ts";
import { done, type Outcome, type Result } from "./outcome.ts";
import { type BillingService, type IntegrationRow, type OfferingRow, planLacksBilling } from "./service.ts";
import {
  checkoutPriceIds,
  idOf,
  isObject,
  type Json,
  linePriceId,
  type ProviderEvent,
  parseSignatureHeader,
  readEvent,
  type SignatureFailure,
  signatureMatches,
  str,
  withinTolerance,
} from "./stripe.ts";
import { licenseEnd, SubscriptionLedger, withinPlan } from "./subscriptions.ts";

const FETCH_TIMEOUT_MS = 10_000;
const PAID = new Set(["paid", "no_payment_required"]);

export interface Receipt {
  event_id: string;
  result: Result;
  replayed: boolean;
}

const signatureInvalid = (reason: SignatureFailure) =>
  new ApiError(
    "BILLING_SIGNATURE_INVALID",
    reason === "missing"
      ? "Send the provider's Stripe-Signature header."
      : reason === "expired"
        ? "The signature's timestamp is more than 300 seconds from the server clock."
        : "The Stripe-Signature header does not verify.",
    { reason },
  );

/**
 * Turns verified provider events into licenses: a checkout creates one, a paid invoice extends it,
 * a cancelled subscription ends it. Each event is applied once: its id is recorded in the same
 * transaction as its changes.
 */
export class BillingWebhookService {
  constructor(
    private readonly deps: Pick<Deps, "db" | "clock" | "ids" | "secrets">,
    private readonly billing: BillingService,
    private readonly claims: ClaimService,
    private readonly licenses: LicenseService,
    private readonly customers: CustomerService,
    private readonly products: ProductService,
    private readonly plan: () => PlanDefinition,
    private readonly mail: MailOutbox | undefined,
    private readonly logger: Logger = silentLogger,
  ) {
    this.subscriptions = new SubscriptionLedger(deps, licenses, plan);
  }

  private readonly subscriptions: SubscriptionLedger;

  async receive(input: {
    rawBody: Uint8Array | undefined;
    signature: string | null;
    body: unknown;
    requestId: string | null;
  }): Promise<Receipt> {
    const environment = this.verify(input.rawBody, input.signature);
    if (!hasFeature(this.plan(), "billing_integration")) throw planLacksBilling();
    const event = readEvent(input.body);
    if (!event)
      throw new ApiError(
        "INVALID_REQUEST",
        "The body is not a provider event (id, type, livemode, data.object).",
      );
    if (event.livemode !== (environment === "live")) {
      throw new ApiError(
        "INVALID_REQUEST",
        `A ${event.livemode ? "live" : "test"}-mode event was signed with the ${environment} secret.`,
        {
          reason: "mode_mismatch",
        },
      );
    }
    const seen = this.eventRow(environment, event.id);
    if (seen && seen.result !== "failed") return { event_id: event.id, result: seen.result, replayed: true };

    const integration = this.billing.integration(environment) as IntegrationRow;
    const ctx: ChangeContext = {
      actor: { type: "billing", id: "stripe" },
      environment,
      requestId: input.requestId,
    };
    let prices: string[] = [];
    if (isCheckout(event)) {
      try {
        prices = await this.checkoutPrices(integration, event.object);
      } catch (error) {
        // Not recorded as processed: the provider retries and the next attempt may reach the API.
        const unreachable = done("failed", "provider_unreachable");
        this.deps.db.transaction((tx) => {
          this.recordLast(tx, environment, event, unreachable);
          recordFailure(tx, this.deps, this.logger, ctx, {
            event,
            outcome: unreachable,
            prices,
            attempts: null,
          });
        });
        throw new ApiError(
          "SERVICE_UNAVAILABLE",
          "The billing provider's API could not be reached to read the checkout's line items.",
          {
            reason: (error as Error).message,
          },
        );
      }
    }
    let outcome: Outcome & { replayed?: boolean };
    try {
      outcome = this.deps.db.transaction((tx) => {
        // Checked again inside the transaction: a concurrent delivery may have won meanwhile.
        const again = this.eventRow(environment, event.id);
        if (again && again.result !== "failed") return { ...done(again.result), replayed: true };
        const applied = this.apply(tx, event, prices, ctx, integration);
        this.record(tx, ctx, event, applied, prices);
        return applied;
      });
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      // Our side refused (quota, archived product, retired policy): nothing was changed. The event
      // is recorded as failed, so the provider stops retrying and a later resend is tried again.
      outcome = done("failed", error.code);
      this.deps.db.transaction((tx) => this.record(tx, ctx, event, outcome, prices));
    }
    return { event_id: event.id, result: outcome.result, replayed: outcome.replayed === true };
  }

  /**
   * What can be refused before the body is read (up to 1 MiB, from anyone): no integration to
   * deliver to, or no well-formed Stripe-Signature header. Most installations use no billing; their
   * webhook route then costs an anonymous caller's body nothing to refuse.
   */
  admit(header: string | null) {
    const secrets = this.billing.webhookSecrets();
    if (secrets.length === 0) throw new ApiError("NOT_FOUND", "No billing integration is configured.");
    const parsed = parseSignatureHeader(header);
    if (typeof parsed === "string") throw signatureInvalid(parsed);
    return { secrets, parsed };
  }

  /** The environment whose secret signed the body; every secret is tried so timing says nothing. */
  private verify(rawBody: Uint8Array | undefined, header: string | null): Environment {
    const { secrets, parsed } = this.admit(header);
    const body = rawBody ?? new Uint8Array(0);
    let environment: Environment | undefined;
    for (const candidate of secrets) {
      if (signatureMatches(candidate.secret, parsed, body)) environment ??= candidate.environment;
    }
    if (!environment) throw signatureInvalid("mismatch");
    if (!withinTolerance(parsed.timestamp, unixSeconds(this.deps.clock.now())))
      throw signatureInvalid("expired");
    return environment;
  }

  private apply(
    tx: Db,
    event: ProviderEvent,
    prices: string[],
    ctx: ChangeContext,
    integration: IntegrationRow,
  ): Outcome {
    switch (event.type) {
      case "checkout.session.completed":
      case "checkout.session.async_payment_succeeded":
        return this.checkout(tx, event.object, prices, ctx, integration);
      case "invoice.paid":
      case "invoice.payment_succeeded":
        return this.subscriptions.invoicePaid(tx, event, ctx);
      case "customer.subscription.updated":
      case "customer.subscription.deleted":
        return this.subscriptions.changed(tx, event, ctx);
      default:
        return done("ignored", "unhandled_type");
    }
  }

  private async checkoutPrices(integration: IntegrationRow, session: Json): Promise<string[]> {
    const carried = checkoutPriceIds(session);
    const id = str(session.id);
    if (carried.length > 0 || !id || session.mode === "setup") return carried;
    const apiKey = this.billing.apiKey(integration);
    if (!apiKey) return [];
    const url = `${integration.apiBaseUrl}/v1/checkout/sessions/${encodeURIComponent(id)}/line_items?limit=100`;
    const response = await fetch(url, {
      headers: { authorization: `Bearer ${apiKey}` },
      redirect: "error",
      signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
    });
    if (!response.ok) throw new Error(`line items: HTTP ${response.status}`);
    const listed: unknown = await response.json();
    const lines = isObject(listed) && Array.isArray(listed.data) ? listed.data.filter(isObject) : [];
    return lines.map(linePriceId).filter((price): price is string => price !== undefined);
  }

  private checkout(
    tx: Db,
    session: Json,
    prices: string[],
    ctx: ChangeContext,
    integration: IntegrationRow,
  ): Outcome {
    const checkoutId = str(session.id);
    if (!checkoutId) return done("failed", "malformed_event");
    if (session.mode === "setup") return done("ignored", "setup_mode");
    if (!PAID.has(String(session.payment_status))) return done("ignored", "payment_pending");
    const fulfilled = tx
      .select()
      .from(billingCheckouts)
      .where(
        and(eq(billingCheckouts.environment, ctx.environment), eq(billingCheckouts.checkoutId, checkoutId)),
      )
      .get();
    if (fulfilled) return done("ignored", "already_fulfilled", fulfilled.licenseId);
    const offering = prices
      .map((price) => this.billing.activeOffering(ctx.environment, price))
      .find((found): found is OfferingRow => found !== undefined);
    if (!offering) return done("failed", "unknown_price");
    const now = this.deps.clock.now();
    const subscriptionId = session.mode === "subscription" ? idOf(session.subscription) : undefined;
    const startingEnd = this.startingEnd(offering, now);
    const subscription = subscriptionId ? this.subscriptions.get(subscriptionId, ctx.environment) : undefined;
    // The same rules as every later subscription event, so the events' order does not matter.
    const expiresAt = withinPlan(
      licenseEnd({
        paidThrough: subscription?.paidThrough ?? null,
        endsAt: subscription?.endsAt ?? null,
        startingEnd,
      }),
      now,
      this.plan(),
    );
    if (expiresAt && expiresAt.getTime() <= now.getTime()) return done("failed", "subscription_ended");

    const buyer = readBuyer(session);
    const customerId = customerForBuyer(this.deps, this.customers, buyer, ctx);
    const license = this.licenses.create(
      {
        product_id: offering.productId,
        policy_id: offering.policyId,
        customer_id: customerId,
        expires_at: expiresAt?.toISOString() ?? null,
        ...(subscriptionId ? { renewal_authority: "external_billing" as const } : {}),
        metadata: {
          billing_provider: "stripe",
          billing_offering_id: offering.id,
          checkout_session_id: checkoutId,
          ...(subscriptionId ? { subscription_id: subscriptionId } : {}),
        },
      },
      ctx,
    );
    tx.insert(billingCheckouts)
      .values({
        checkoutId,
        environment: ctx.environment,
        licenseId: license.id,
        offeringId: offering.id,
        subscriptionId: subscriptionId ?? null,
        createdAt: now,
      })
      .run();
    if (subscriptionId)
      this.subscriptions.upsert(tx, ctx.environment, subscriptionId, { licenseId: license.id, startingEnd });
    // Stripe's checkout locale, when the buyer's browser chose one, picks the email's language.
    const locale = str(session.locale);
    this.deliver(
      tx,
      license,
      { email: buyer.email, locale: locale === "auto" ? undefined : locale },
      integration,
      offering,
    );
    return done("succeeded", null, license.id);
  }

  /**
   * The expiry a bought license starts with (null: none): the offering's duration, else the
   * policy's default, as the Management API would give it.
   */
  private startingEnd(offering: OfferingRow, now: Date): Date | null {
    if (offering.licenseDurationDays !== null)
      return new Date(now.getTime() + offering.licenseDurationDays * 86_400_000);
    const policy = this.deps.db.select().from(policies).where(eq(policies.id, offering.policyId)).get();
    return policy ? defaultExpiry(settingsOf(policy), now) : null;
  }

  /** The buyer's key goes out by email: a single-use claim link, or the key itself when secure claims are off. */
  private deliver(
    tx: Db,
    license: LicenseRow,
    buyer: { email?: string; locale?: string },
    integration: IntegrationRow,
    offering: OfferingRow,
  ): void {
    const claim = this.claims.create(tx, license);
    if (!buyer.email || !this.mail) return;
    const product = this.products.get(offering.productId, license.environment);
    const claimUrl = `${this.billing.claimUrl(integration)}#${claim.token}`;
    this.mail.enqueue(tx, {
      to: buyer.email,
      template: "license_delivery",
      ...(buyer.locale ? { locale: buyer.locale } : {}),
      data: {
        product_name: product.name,
        expires_at: license.expiresAt?.toISOString() ?? "",
        ...(integration.secureClaims ? { claim_url: claimUrl } : { license_key: claim.licenseKey }),
      },
    });
  }

  /** Event ids are the environment's: a test event cannot take a live one's id (or the reverse). */
  private eventRow(environment: Environment, eventId: string) {
    return this.deps.db
      .select()
      .from(billingEvents)
      .where(and(eq(billingEvents.environment, environment), eq(billingEvents.eventId, eventId)))
      .get();
  }

  private record(
    tx: Db,
    ctx: ChangeContext,
    event: ProviderEvent,
    outcome: Outcome,
    prices: readonly string[],
  ): void {
    const { environment } = ctx;
    const now = this.deps.clock.now();
    const previous = this.eventRow(environment, event.id);
    const row = {
      eventId: event.id,
      environment,
      type: event.type,
      result: outcome.result,
      reason: outcome.reason,
      licenseId: outcome.licenseId ?? null,
      attempts: (previous?.attempts ?? 0) + 1,
      createdAt: previous?.createdAt ?? now,
      updatedAt: now,
    };
    tx.insert(billingEvents)
      .values(row)
      .onConflictDoUpdate({ target: [billingEvents.environment, billingEvents.eventId], set: row })
      .run();
    this.recordLast(tx, environment, event, outcome);
    if (outcome.result === "failed")
      recordFailure(tx, this.deps, this.logger, ctx, { event, outcome, prices, attempts: row.attempts });
  }

  private recordLast(tx: Db, environment: Environment, event: ProviderEvent, outcome: Outcome): void {
    tx.update(billingIntegrations)
      .set({
        lastEventId: event.id,
        lastEventType: event.type,
        lastEventResult: outcome.result,
        lastEventReason: outcome.reason,
        lastEventAt: this.deps.clock.now(),
      })
      .where(eq(billingIntegrations.environment, environment))
      .run();
  }
}

const isCheckout = (event: ProviderEvent) =>
  event.type === "checkout.session.completed" || event.type === "checkout.session.async_payment_succeeded";
