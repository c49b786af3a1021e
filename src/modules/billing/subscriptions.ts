import { eq, sql } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { licenseStatus } from "../../domain/license-state.ts";
import type { PlanDefinition } from "../../domain/plans.ts";
import type { Environment } from "../../domain/scopes.ts";
import type { Db } from "../../store/db.ts";
import { billingSubscriptions, licenses } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import type { LicenseRow, LicenseService } from "../licenses/service.ts";
import { done, type Outcome } from "./outcome.ts";
import { decidePrices, KEEP, type PriceDecision } from "./prices.ts";
import {
  invoicePeriodEnd,
  invoicePriceIds,
  invoiceSubscriptionId,
  type ProviderEvent,
  str,
  subscriptionEnd,
  subscriptionPriceIds,
  subscriptionTerminal,
} from "./stripe.ts";

/** A renewal may arrive a little after the period it pays for begins; the license waits this long. */
export const RENEWAL_GRACE_SEC = 86_400;

export type SubscriptionRow = typeof billingSubscriptions.$inferSelect;

/**
 * What each provider subscription has paid for and when it ends, and the license expiry that
 * follows from it. Rows may exist before their license: the provider does not order its events.
 */
export class SubscriptionLedger {
  constructor(
    private readonly deps: Pick<Deps, "db" | "clock" | "ids">,
    private readonly licenses: Pick<LicenseService, "productIsActive">,
    private readonly plan: () => PlanDefinition,
  ) {}

  invoicePaid(tx: Db, event: ProviderEvent, ctx: ChangeContext): Outcome {
    const subscriptionId = invoiceSubscriptionId(event.object);
    if (!subscriptionId) return done("ignored", "not_a_subscription_invoice");
    const periodEnd = invoicePeriodEnd(event.object);
    if (periodEnd === undefined) return done("failed", "no_period_end");
    const current = this.get(subscriptionId, ctx.environment);
    const paidThrough = new Date(Math.max(periodEnd * 1000, current?.paidThrough?.getTime() ?? 0));
    const license = this.licenseOf(tx, current);
    // A license billing no longer extends takes nothing from the invoice, whatever its price; the
    // ledger still follows the subscription, so a license handed back to billing gets what was paid.
    const held = current?.licenseId ? heldFromBilling(license) : undefined;
    if (held) {
      this.upsert(tx, ctx.environment, subscriptionId, { paidThrough });
      return done("ignored", held, current?.licenseId ?? null);
    }
    let price = decidePrices(tx, ctx.environment, invoicePriceIds(event.object), license);
    const earlierPeriod = periodEnd * 1000 < (current?.paidThrough?.getTime() ?? 0);
    if (price.kind === "refused") {
      // A period a later invoice already paid grants nothing, so its price has nothing to decide
      // (nor could a resend once an offering maps it).
      if (earlierPeriod) return done("ignored", "period_already_paid", license?.id ?? null);
      // Nothing is kept of an invoice for a price that cannot renew the license: no time is paid for.
      return done("failed", price.reason, license?.id ?? null);
    }
    // Only the newest word on the price moves the license: an invoice for an earlier period, or one
    // made before the subscription change already applied, renews but does not switch it back.
    const newest =
      !earlierPeriod &&
      !(event.created !== undefined && current && olderThanApplied(event.created, event.id, current));
    if (!newest) price = KEEP;
    const next = this.upsert(tx, ctx.environment, subscriptionId, { paidThrough });
    if (!next.licenseId) return done("succeeded", "awaiting_checkout");
    return this.applyEnd(tx, next, event, ctx, price);
  }

  /**
   * A subscription's new state. Each event carries the whole subscription as it was when Stripe
   * created the event, so the newest one (by `created`, then id) decides and an older one arriving
   * late is ignored. The end is final: once deleted (or canceled), nothing revives it.
   */
  changed(tx: Db, event: ProviderEvent, ctx: ChangeContext): Outcome {
    const subscriptionId = str(event.object.id);
    const created = event.created;
    if (!subscriptionId || created === undefined) return done("failed", "malformed_event");
    const current = this.get(subscriptionId, ctx.environment);
    const stale = current ? olderThanApplied(created, event.id, current) : false;
    if (current?.ended) return done("ignored", stale ? "stale" : "subscription_ended", current.licenseId);
    const ending = event.type === "customer.subscription.deleted" || subscriptionTerminal(event.object);
    // An end is applied even when a newer change came first: the subscription cannot have restarted.
    if (stale && !ending) return done("ignored", "stale", current?.licenseId ?? null);
    const end = subscriptionEndAt(event, created, current);
    // An ending subscription's price no longer matters; a running one's decides the license's policy.
    const license = this.licenseOf(tx, current);
    const price =
      ending || !license
        ? KEEP
        : decidePrices(tx, ctx.environment, subscriptionPriceIds(event.object), license);
    const next = this.upsert(tx, ctx.environment, subscriptionId, {
      endsAt: end === undefined ? null : new Date(end * 1000),
      ended: ending,
      ...(stale ? {} : { stateEventAt: new Date(created * 1000), stateEventId: event.id }),
    });
    if (!next.licenseId) return done("succeeded", "awaiting_checkout");
    return this.applyEnd(tx, next, event, ctx, price);
  }

  private licenseOf(tx: Db, subscription: SubscriptionRow | undefined): LicenseRow | undefined {
    if (!subscription?.licenseId) return undefined;
    return tx.select().from(licenses).where(eq(licenses.id, subscription.licenseId)).get();
  }

  /**
   * Moves the license's expiry to what the subscription now grants, computed from everything known
   * about it rather than from the expiry the last event left: so the events' order does not matter,
   * and a first paid invoice replaces the checkout's starting expiry, shorter or not. A price that
   * moved to another offering of the product moves the license to that offering's policy; one the
   * offerings refuse may still shorten or end the license, never lengthen it.
   */
  private applyEnd(
    tx: Db,
    subscription: SubscriptionRow,
    event: ProviderEvent,
    ctx: ChangeContext,
    price: PriceDecision,
  ): Outcome {
    const licenseId = subscription.licenseId as string;
    const license = tx.select().from(licenses).where(eq(licenses.id, licenseId)).get();
    const held = heldFromBilling(license);
    if (held || !license) return done("ignored", held ?? "license_revoked", licenseId);
    const now = this.deps.clock.now();
    const target = withinPlan(licenseEnd(subscription), now, this.plan());
    const refused = price.kind === "refused" ? price.reason : null;
    let offering = price.kind === "switch" ? price.offering : undefined;
    const moves = (target?.getTime() ?? null) !== (license.expiresAt?.getTime() ?? null);
    const lengthens = moves && license.expiresAt !== null && (target === null || target > license.expiresAt);
    if (lengthens && refused) return done("failed", refused, licenseId);
    // An archived product's licenses take no more time and no new terms, as through the Management
    // API: billing may only take time away. The subscription's record above is kept (an end among
    // it stays known), so once the product is active again its next event grants what it says.
    let archived = false;
    if ((lengthens || offering) && !this.licenses.productIsActive(license)) {
      if (lengthens) return done("ignored", "product_archived", licenseId);
      archived = true;
      offering = undefined;
    }
    if (!moves && !offering) {
      if (refused) return done("failed", refused, licenseId);
      return done("ignored", archived ? "product_archived" : "unchanged", licenseId);
    }
    const next = {
      ...license,
      expiresAt: target,
      updatedAt: now,
      version: license.version + 1,
      ...(offering
        ? {
            policyId: offering.policyId,
            metadata: { ...license.metadata, billing_offering_id: offering.id },
          }
        : {}),
    };
    const before = licenseStatus(license, now);
    const after = licenseStatus(next, now);
    tx.update(licenses)
      .set({
        expiresAt: next.expiresAt,
        updatedAt: now,
        version: next.version,
        policyId: next.policyId,
        metadata: next.metadata,
        ...expiryAnnouncement(license, target, now),
      })
      .where(eq(licenses.id, licenseId))
      .run();
    const changes = [...(offering ? ["policy_id", "metadata"] : []), ...(moves ? ["expires_at"] : [])];
    recordAudit(tx, this.deps, ctx, {
      type: "license.updated",
      target: { type: "license", id: licenseId },
      data: {
        changes,
        billing_event_id: event.id,
        billing_event_type: event.type,
        ...(offering
          ? {
              from_policy_id: license.policyId,
              to_policy_id: offering.policyId,
              billing_offering_id: offering.id,
            }
          : {}),
      },
    });
    if (before === "expired" && after === "active") {
      recordAudit(tx, this.deps, ctx, {
        type: "license.renewed",
        target: { type: "license", id: licenseId },
        data: { reason: null },
      });
    }
    if (endsAt(license, target, now)) {
      recordAudit(tx, this.deps, ctx, {
        type: "license.expired",
        target: { type: "license", id: licenseId },
        data: { billing_event_id: event.id },
      });
    }
    return done(refused ? "failed" : "succeeded", refused, licenseId);
  }

  get(subscriptionId: string, environment: Environment): SubscriptionRow | undefined {
    return this.deps.db
      .select()
      .from(billingSubscriptions)
      .where(
        sql`${billingSubscriptions.environment} = ${environment} and ${billingSubscriptions.subscriptionId} = ${subscriptionId}`,
      )
      .get();
  }

  upsert(
    tx: Db,
    environment: Environment,
    subscriptionId: string,
    changes: Partial<
      Pick<
        SubscriptionRow,
        "licenseId" | "paidThrough" | "endsAt" | "startingEnd" | "stateEventAt" | "stateEventId" | "ended"
      >
    >,
  ): SubscriptionRow {
    const current = this.get(subscriptionId, environment);
    const row: SubscriptionRow = {
      environment,
      subscriptionId,
      licenseId: current?.licenseId ?? null,
      paidThrough: current?.paidThrough ?? null,
      endsAt: current?.endsAt ?? null,
      startingEnd: current?.startingEnd ?? null,
      stateEventAt: current?.stateEventAt ?? null,
      stateEventId: current?.stateEventId ?? null,
      ended: current?.ended ?? false,
      ...changes,
      updatedAt: this.deps.clock.now(),
    };
    tx.insert(billingSubscriptions)
      .values(row)
      .onConflictDoUpdate({
        target: [billingSubscriptions.environment, billingSubscriptions.subscriptionId],
        set: row,
      })
      .run();
    return row;
  }
}

/**
 * Why billing no longer moves a subscription's license: it is revoked (or gone), or the vendor took
 * over extending it (renewal_authority `vendor`), so its expiry is theirs now. The ledger still
 * follows the subscription, for when they hand the authority back.
 */
function heldFromBilling(
  license: LicenseRow | undefined,
): "license_revoked" | "vendor_renewal_authority" | undefined {
  if (!license || license.status === "revoked") return "license_revoked";
  if (license.renewalAuthority === "vendor") return "vendor_renewal_authority";
  return undefined;
}

/**
 * Whether this change ends the license at once: its expiry was still ahead and now is not. Read
 * from the expiry alone, whatever the license's suspension: a suspended license's expiry passes
 * like any other (the expiry scan announces it too), so a late cancellation that ends a suspended
 * license is announced as well.
 */
function endsAt(license: LicenseRow, target: Date | null, now: Date): boolean {
  const ranBefore = license.expiresAt === null || license.expiresAt.getTime() > now.getTime();
  return ranBefore && target !== null && target.getTime() <= now.getTime();
}

/**
 * The license.expired audit event of a change that ends the license at once announces it, so the
 * expiry scan must not (webhooks/expiries.ts). An expiry that had passed and been announced, moved
 * to another past moment, is the same end: it stays announced ("not announced twice").
 */
function expiryAnnouncement(license: LicenseRow, target: Date | null, now: Date): { expiryAnnounced?: Date } {
  if (!target) return {};
  if (endsAt(license, target, now)) return { expiryAnnounced: target };
  const announced =
    license.expiresAt !== null &&
    license.expiresAt.getTime() <= now.getTime() &&
    license.expiryAnnounced?.getTime() === license.expiresAt.getTime();
  return announced && target.getTime() <= now.getTime() ? { expiryAnnounced: target } : {};
}

/**
 * When a subscription event says the subscription stops granting the license (Unix seconds;
 * undefined: it runs on). An end without `ended_at` (a deletion, or `unpaid`, which has none) is
 * the event's own `created` time rather than the moment it happens to be delivered, so a redelivery
 * or a late retry says the same. A subscription still unpaid keeps the earlier end its first unpaid
 * state gave: each later update of it (Stripe rolls an unpaid subscription's period on) would
 * otherwise move an ended license's end later.
 */
function subscriptionEndAt(
  event: ProviderEvent,
  created: number,
  current: SubscriptionRow | undefined,
): number | undefined {
  if (event.type === "customer.subscription.deleted")
    return subscriptionEnd({ ...event.object, status: "canceled" }, created) ?? created;
  const end = subscriptionEnd(event.object, created);
  const stored = current?.endsAt ? Math.floor(current.endsAt.getTime() / 1000) : undefined;
  if (str(event.object.status) === "unpaid" && end !== undefined && stored !== undefined)
    return Math.min(end, stored);
  return end;
}

/**
 * Whether a change Stripe created at `created` (Unix seconds) precedes the newest one applied.
 * Changes created in the same second are ordered by event id: arbitrary, but the same whatever
 * order they arrive in, so every delivery order ends in the same state.
 */
function olderThanApplied(created: number, eventId: string, applied: SubscriptionRow): boolean {
  if (!applied.stateEventAt) return false;
  const appliedSec = Math.floor(applied.stateEventAt.getTime() / 1000);
  return created < appliedSec || (created === appliedSec && eventId < (applied.stateEventId ?? ""));
}

/**
 * What a subscription grants its license (null: no expiry): the paid period plus a day's grace for
 * the renewal's webhook once a paid invoice is known, else the expiry its checkout started it with;
 * a scheduled or past end only ever cuts that short. A cancellation date never grants time that
 * was not paid for, however early it arrives.
 */
export function licenseEnd(
  subscription: Pick<SubscriptionRow, "paidThrough" | "endsAt" | "startingEnd">,
): Date | null {
  const granted = subscription.paidThrough
    ? new Date(subscription.paidThrough.getTime() + RENEWAL_GRACE_SEC * 1000)
    : subscription.startingEnd;
  const { endsAt } = subscription;
  if (!endsAt) return granted;
  return granted && granted.getTime() < endsAt.getTime() ? granted : endsAt;
}

/**
 * What the subscription behind a license grants it now (undefined: no subscription made it): for a
 * license whose renewal authority the vendor hands back to billing.
 */
export function subscriptionGrant(
  tx: Db,
  licenseId: string,
  now: Date,
  plan: PlanDefinition,
): Date | null | undefined {
  const row = tx
    .select()
    .from(billingSubscriptions)
    .where(eq(billingSubscriptions.licenseId, licenseId))
    .get();
  return row ? withinPlan(licenseEnd(row), now, plan) : undefined;
}

/**
 * The plan's longest license (`license_duration_max_sec`) holds for billing as for the Management
 * API, but a paid purchase or renewal is not refused over it: the expiry is cut to the longest the
 * plan allows from now. No expiry stays none, as the Management API allows.
 */
export function withinPlan(end: Date | null, now: Date, plan: PlanDefinition): Date | null {
  if (end === null) return null;
  const longest = now.getTime() + plan.license_duration_max_sec * 1000;
  return end.getTime() > longest ? new Date(longest) : end;
}
