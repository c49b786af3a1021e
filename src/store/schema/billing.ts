import { sql } from "drizzle-orm";
import { index, integer, primaryKey, sqliteTable, text, uniqueIndex } from "drizzle-orm/sqlite-core";
import { policies, products } from "./catalog.ts";
import { timestamp } from "./columns.ts";
import { licenses } from "./licenses.ts";

/**
 * The billing provider integration, one per environment: a provider's test mode feeds test
 * products, its live mode live ones. The restricted API key and the webhook signing secret are
 * stored only encrypted with the keystore's data key (SecretBox, bound to this row's environment).
 */
export const billingIntegrations = sqliteTable("billing_integrations", {
  environment: text("environment", { enum: ["live", "test"] }).primaryKey(),
  provider: text("provider", { enum: ["stripe"] }).notNull(),
  status: text("status", { enum: ["active", "disabled"] }).notNull(),
  /** Null once disabled: disabling forgets both secrets. */
  apiKeyCiphertext: text("api_key_ciphertext"),
  webhookSecretCiphertext: text("webhook_secret_ciphertext"),
  /** Where line items are fetched from; the provider's own API unless a compatible one is named. */
  apiBaseUrl: text("api_base_url").notNull(),
  claimUrlBase: text("claim_url_base"),
  secureClaims: integer("secure_claims", { mode: "boolean" }).notNull(),
  lastEventId: text("last_event_id"),
  lastEventType: text("last_event_type"),
  lastEventResult: text("last_event_result"),
  lastEventReason: text("last_event_reason"),
  lastEventAt: timestamp("last_event_at"),
  /**
   * The last event that failed, kept until another fails: `last_event` moves on with every
   * delivery, and a purchase that failed must stay visible until someone fixes it.
   */
  lastFailureId: text("last_failure_id"),
  lastFailureType: text("last_failure_type"),
  lastFailureReason: text("last_failure_reason"),
  lastFailureAt: timestamp("last_failure_at"),
  createdAt: timestamp("created_at").notNull(),
  updatedAt: timestamp("updated_at").notNull(),
});

/** A provider price sold as a license of one product under one policy. */
export const billingOfferings = sqliteTable(
  "billing_offerings",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    priceId: text("price_id").notNull(),
    name: text("name"),
    productId: text("product_id")
      .notNull()
      .references(() => products.id),
    policyId: text("policy_id")
      .notNull()
      .references(() => policies.id),
    /** For one-time prices (and subscriptions until their first invoice): how long the license lasts. */
    licenseDurationDays: integer("license_duration_days"),
    status: text("status", { enum: ["active", "removed"] }).notNull(),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
  },
  (t) => [
    // A price maps to one active offering; removed ones stay for the history of licenses they made.
    uniqueIndex("billing_offerings_active_price").on(t.environment, t.priceId).where(sql`status = 'active'`),
  ],
);

/**
 * One row per provider event id, written in the same transaction as the changes it caused, so a
 * redelivered event is recognised and changes nothing. Failed events are processed again when
 * redelivered (the operator may have fixed what made them fail). Keyed by environment too: each
 * mode has its own signing secret, and whoever holds the test one must not be able to take a live
 * event's id (or checkout id, below) before the live delivery comes.
 */
export const billingEvents = sqliteTable(
  "billing_events",
  {
    eventId: text("event_id").notNull(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    type: text("type").notNull(),
    result: text("result", { enum: ["succeeded", "ignored", "failed"] }).notNull(),
    reason: text("reason"),
    licenseId: text("license_id"),
    attempts: integer("attempts").notNull(),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.environment, t.eventId] }),
    // The failed ones not applied since, counted by the status: few, whatever the history's size.
    index("billing_events_failed").on(t.environment).where(sql`result = 'failed'`),
  ],
);

/**
 * A checkout's license, and the subscription that renews it. A subscription row can exist before
 * its license: the provider does not order events, so an invoice may arrive before the checkout.
 */
export const billingSubscriptions = sqliteTable(
  "billing_subscriptions",
  {
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    subscriptionId: text("subscription_id").notNull(),
    licenseId: text("license_id").references(() => licenses.id),
    /** The end of the last paid period (provider time). */
    paidThrough: timestamp("paid_through"),
    /** Set when the provider says the subscription ends (at period end, or now). */
    endsAt: timestamp("ends_at"),
    /**
     * The expiry its checkout started the license with (null once there is a license: none), which
     * holds until a paid invoice is known. Kept so that a cancellation undone before the first
     * invoice restores it, whatever order the events came in.
     */
    startingEnd: timestamp("starting_end"),
    /**
     * The provider's `created` time and id of the newest subscription change applied. The provider
     * does not order its events: a change older than this one arrives late and is ignored.
     */
    stateEventAt: timestamp("state_event_at"),
    stateEventId: text("state_event_id"),
    /** The subscription reached a terminal status (canceled, incomplete_expired): no change revives it. */
    ended: integer("ended", { mode: "boolean" }).notNull().default(false),
    updatedAt: timestamp("updated_at").notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.environment, t.subscriptionId] }),
    index("billing_subscriptions_license").on(t.licenseId),
  ],
);

/** Exactly one license per checkout, however often or however concurrently it is reported. */
export const billingCheckouts = sqliteTable(
  "billing_checkouts",
  {
    checkoutId: text("checkout_id").notNull(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    licenseId: text("license_id")
      .notNull()
      .references(() => licenses.id),
    offeringId: text("offering_id").notNull(),
    subscriptionId: text("subscription_id"),
    createdAt: timestamp("created_at").notNull(),
  },
  (t) => [primaryKey({ columns: [t.environment, t.checkoutId] })],
);

/** A single-use claim of a bought license's key; only an HMAC of the token is stored. */
export const billingClaims = sqliteTable(
  "billing_claims",
  {
    tokenLookup: text("token_lookup").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    licenseId: text("license_id")
      .notNull()
      .references(() => licenses.id),
    createdAt: timestamp("created_at").notNull(),
    expiresAt: timestamp("expires_at").notNull(),
    redeemedAt: timestamp("redeemed_at"),
  },
  (t) => [index("billing_claims_license").on(t.licenseId)],
);
