import { index, integer, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { timestamp } from "./columns.ts";

/**
 * Webhook endpoints, shared by live and test (spec §4.3). The URL is stored encrypted: a team-chat
 * URL alone lets anyone post into the channel, and one rule for every URL keeps it simple. Only the
 * host is kept in the clear, for display. Signing secrets are encrypted with the data key, bound to
 * the endpoint id (SecretBox context).
 */
export const webhookEndpoints = sqliteTable(
  "webhook_endpoints",
  {
    id: text("id").primaryKey(),
    name: text("name").notNull(),
    kind: text("kind", { enum: ["standard", "slack", "discord", "teams"] }).notNull(),
    urlCiphertext: text("url_ciphertext").notNull(),
    urlHost: text("url_host").notNull(),
    events: text("events", { mode: "json" }).$type<string[]>().notNull(),
    status: text("status", { enum: ["active", "disabled", "stopped"] }).notNull(),
    /** Why a `disabled` endpoint stopped receiving: `gone` (HTTP 410 from the receiver). */
    disabledReason: text("disabled_reason"),
    secretCiphertext: text("secret_ciphertext"),
    /** The secret before the last rotation; it keeps signing until `previousSecretExpiresAt`. */
    previousSecretCiphertext: text("previous_secret_ciphertext"),
    previousSecretExpiresAt: timestamp("previous_secret_expires_at"),
    /** Bumped on every change, so a rotated secret's ciphertext context never repeats. */
    revision: integer("revision").notNull(),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
  },
  (t) => [index("webhook_endpoints_status").on(t.status)],
);

/** One row per event to deliver: the exact body bytes are fixed at enqueue so every attempt signs the same. */
export const webhookEvents = sqliteTable("webhook_events", {
  /** `msg_` + ULID: the `webhook-id` header, stable across retries and replays. */
  id: text("id").primaryKey(),
  environment: text("environment", { enum: ["live", "test"] }).notNull(),
  type: text("type").notNull(),
  payload: text("payload").notNull(),
  createdAt: timestamp("created_at").notNull(),
});

/** The outbox: one row per (event, endpoint), claimed by the dispatcher with a lease. */
export const webhookDeliveries = sqliteTable(
  "webhook_deliveries",
  {
    id: text("id").primaryKey(),
    endpointId: text("endpoint_id")
      .notNull()
      .references(() => webhookEndpoints.id),
    eventId: text("event_id")
      .notNull()
      .references(() => webhookEvents.id),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    eventType: text("event_type").notNull(),
    status: text("status", {
      enum: ["pending", "delivering", "succeeded", "failed", "cancelled"],
    }).notNull(),
    attempts: integer("attempts").notNull(),
    /** Attempts made before the last replay; the retry schedule restarts from there. */
    scheduleStart: integer("schedule_start").notNull(),
    nextAttemptAt: timestamp("next_attempt_at").notNull(),
    /** While `delivering`: when the claim lapses and the row is due again (a crashed attempt). */
    claimedUntil: timestamp("claimed_until"),
    lastResponseStatus: integer("last_response_status"),
    lastError: text("last_error"),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
    completedAt: timestamp("completed_at"),
  },
  (t) => [
    index("webhook_deliveries_due").on(t.status, t.nextAttemptAt),
    index("webhook_deliveries_endpoint").on(t.endpointId, t.environment, t.id),
    // The dispatcher finds each endpoint's due deliveries, oldest first, by a seek: it runs
    // whenever an attempt ends, and a scan of every due row took 18 ms at 50,000 (migration 0039).
    index("webhook_deliveries_endpoint_due").on(t.endpointId, t.status, t.nextAttemptAt, t.id),
    // Purging old events checks (foreign key) that no delivery still names them.
    index("webhook_deliveries_event").on(t.eventId),
  ],
);

/** Every attempt, in order: the delivery log the vendor reads. */
export const webhookAttempts = sqliteTable(
  "webhook_attempts",
  {
    id: text("id").primaryKey(),
    deliveryId: text("delivery_id")
      .notNull()
      .references(() => webhookDeliveries.id),
    number: integer("number").notNull(),
    startedAt: timestamp("started_at").notNull(),
    durationMs: integer("duration_ms").notNull(),
    outcome: text("outcome", { enum: ["succeeded", "failed", "refused"] }).notNull(),
    responseStatus: integer("response_status"),
    error: text("error"),
  },
  (t) => [index("webhook_attempts_delivery").on(t.deliveryId, t.number)],
);

/** Small persistent marks of the dispatcher, e.g. up to when license and lease expiries were announced. */
export const webhookMarks = sqliteTable("webhook_marks", {
  name: text("name").primaryKey(),
  value: integer("value").notNull(),
});
