import { and, count, eq, isNull, notInArray, or } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import type { Environment } from "../../domain/scopes.ts";
import type { Logger } from "../../http/logger.ts";
import type { Db } from "../../store/db.ts";
import { billingEvents, billingIntegrations } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import type { Outcome } from "./outcome.ts";
import type { IntegrationRow } from "./service.ts";
import { idOf, invoiceSubscriptionId, MAX_PROVIDER_ID_LENGTH, type ProviderEvent, str } from "./stripe.ts";

/** A checkout names a few prices; an event naming more is cut, so the audit event stays small. */
const MAX_PRICES = 20;

/** Ids longer than a provider's are left out of the audit event and the log. */
const shortId = (value: string | undefined): string | undefined =>
  value !== undefined && value.length <= MAX_PROVIDER_ID_LENGTH ? value : undefined;

/**
 * The ids a vendor finds a failed purchase by in the provider's dashboard. Never the buyer's
 * address or name: the audit log and the server log keep no personal data of buyers.
 */
export function eventSubjects(event: ProviderEvent, prices: readonly string[]): Record<string, unknown> {
  const object = event.object;
  const subjects: Record<string, unknown> = {};
  if (event.type.startsWith("checkout.session.")) {
    subjects.checkout_id = shortId(str(object.id));
    subjects.subscription_id = shortId(idOf(object.subscription));
  } else if (event.type.startsWith("invoice.")) {
    subjects.invoice_id = shortId(str(object.id));
    subjects.subscription_id = shortId(invoiceSubscriptionId(object));
  } else if (event.type.startsWith("customer.subscription.")) {
    subjects.subscription_id = shortId(str(object.id));
  }
  const named = prices.filter((price) => price.length <= MAX_PROVIDER_ID_LENGTH).slice(0, MAX_PRICES);
  if (named.length > 0) subjects.price_ids = named;
  return Object.fromEntries(Object.entries(subjects).filter(([, value]) => value !== undefined));
}

/**
 * What a failed event leaves behind, so the vendor can find it, fix the cause and resend it:
 * the integration's `last_failure` (which, unlike `last_event`, the next delivery does not
 * overwrite) and a warning in the server log; and, when the event is recorded as processed (the
 * provider got a 200 and will not retry it), a `billing_event.failed` audit event, delivered to
 * webhook endpoints like any other. An attempt the provider retries by itself (its API was
 * unreachable: a 503) is not audited, or each retry would be. Called in the transaction that
 * records the event.
 */
export function recordFailure(
  tx: Db,
  deps: Pick<Deps, "clock" | "ids">,
  logger: Logger,
  ctx: ChangeContext,
  failure: {
    event: ProviderEvent;
    outcome: Outcome;
    prices: readonly string[];
    /** The attempts recorded for the event, this one included; null when the provider retries it. */
    attempts: number | null;
  },
): void {
  const { event, outcome } = failure;
  tx.update(billingIntegrations)
    .set({
      lastFailureId: event.id,
      lastFailureType: event.type,
      lastFailureReason: outcome.reason,
      lastFailureAt: deps.clock.now(),
    })
    .where(eq(billingIntegrations.environment, ctx.environment))
    .run();
  const data = {
    event_id: event.id,
    event_type: event.type,
    reason: outcome.reason,
    ...eventSubjects(event, failure.prices),
  };
  if (failure.attempts !== null) {
    recordAudit(tx, deps, ctx, {
      type: "billing_event.failed",
      target: { type: "billing_event", id: event.id },
      data: { ...data, attempts: failure.attempts },
    });
  }
  logger.log("warn", "billing event failed", {
    environment: ctx.environment,
    request_id: ctx.requestId,
    retried_by_provider: failure.attempts === null,
    ...data,
  });
}

export interface FailureView {
  id: string;
  type: string;
  result: "failed";
  reason: string | null;
  at: string;
  resolved_at: string | null;
}

/**
 * Failures no resend can turn into anything else: the event itself lacks what is needed (its id or
 * `created` time, an invoice's period), or the subscription ended before its checkout came, so the
 * license would be born expired. Everything else (a price no offering maps, a policy retired, a
 * quota full, a product archived: any refusal of ours) the vendor can fix and then resend.
 */
export const TERMINAL_FAILURES = ["malformed_event", "no_period_end", "subscription_ended"] as const;

/**
 * The last failure, resolved once its event was applied since (a resend that succeeded or was
 * ignored), and how many recorded failures a resend could still apply: the terminal ones are kept
 * as `last_failure` and audited, but waiting on them would keep an alert on for ever.
 */
export function failureStatus(
  db: Db,
  environment: Environment,
  row: IntegrationRow | undefined,
): { last_failure: FailureView | null; unresolved_failures: number } {
  const unresolved =
    db
      .select({ n: count() })
      .from(billingEvents)
      .where(
        and(
          eq(billingEvents.environment, environment),
          eq(billingEvents.result, "failed"),
          or(isNull(billingEvents.reason), notInArray(billingEvents.reason, [...TERMINAL_FAILURES])),
        ),
      )
      .get()?.n ?? 0;
  if (!row?.lastFailureId || !row.lastFailureType || !row.lastFailureAt)
    return { last_failure: null, unresolved_failures: unresolved };
  const since = db
    .select({ result: billingEvents.result, updatedAt: billingEvents.updatedAt })
    .from(billingEvents)
    .where(and(eq(billingEvents.environment, environment), eq(billingEvents.eventId, row.lastFailureId)))
    .get();
  // An event recorded as anything but failed is final: no delivery changes it again.
  const resolved = since !== undefined && since.result !== "failed";
  return {
    last_failure: {
      id: row.lastFailureId,
      type: row.lastFailureType,
      result: "failed",
      reason: row.lastFailureReason,
      at: row.lastFailureAt.toISOString(),
      resolved_at: resolved ? since.updatedAt.toISOString() : null,
    },
    unresolved_failures: unresolved,
  };
}
