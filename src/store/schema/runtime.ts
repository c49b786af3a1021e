import { sql } from "drizzle-orm";
import { index, integer, sqliteTable, text, uniqueIndex } from "drizzle-orm/sqlite-core";
import { products } from "./catalog.ts";
import { timestamp } from "./columns.ts";
import { licenses } from "./licenses.ts";

export const activations = sqliteTable(
  "activations",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    productId: text("product_id")
      .notNull()
      .references(() => products.id),
    licenseId: text("license_id")
      .notNull()
      .references(() => licenses.id),
    status: text("status", { enum: ["active", "deactivated"] }).notNull(),
    deviceSigningKey: text("device_signing_key").notNull(),
    deviceThumbprint: text("device_thumbprint").notNull(),
    deviceKemKey: text("device_kem_key").notNull(),
    machineInfo: text("machine_info", { mode: "json" }).$type<Record<string, unknown>>().notNull(),
    machineInfoDigest: text("machine_info_digest").notNull(),
    /** When the full machine_info was last sent; heartbeats need it again after 24 hours. */
    machineBaselineAt: timestamp("machine_baseline_at").notNull(),
    machineSignals: text("machine_signals", { mode: "json" }).$type<Record<string, string>>().notNull(),
    appVersion: text("app_version"),
    sdkVersion: text("sdk_version"),
    activatedAt: timestamp("activated_at").notNull(),
    lastSeenAt: timestamp("last_seen_at").notNull(),
    lastHeartbeatAt: timestamp("last_heartbeat_at"),
    certificateExpiresAt: timestamp("certificate_expires_at").notNull(),
    deactivatedAt: timestamp("deactivated_at"),
    deactivationReason: text("deactivation_reason", { enum: ["device", "vendor", "culled"] }),
    /** Set for a device bound by an offline package: it holds its machine slot until then. */
    offlineUntil: timestamp("offline_until"),
  },
  (t) => [
    // A license's devices, newest first, a page at a time (migration 0022; it replaced
    // (license_id, status), with which every page sorted all of the license's rows: 140 ms for
    // 100k devices, on the thread that serves heartbeats). Counting a license's active devices
    // uses the device index below.
    index("activations_license_newest").on(t.licenseId, t.id),
    // The usage report counts an environment's activations by when they were made (migration
    // 0018; it replaced (environment, id) and the device-key index, which no query used and every
    // activation paid for), and the devices that held one at a moment, which needs when each was
    // deactivated: with it in the index the count reads no table row (migration 0027: 270-300 ms
    // to ~50 ms at a million devices, on the thread that serves heartbeats). Only a deactivation
    // moves the entry.
    index("activations_env_activated").on(t.environment, t.activatedAt, t.deactivatedAt),
    // Re-activation looks a device up on its license; without this SQLite scans the license's rows.
    // Status before the device (migration 0025): counting a license's active devices, when it is
    // full, then reads only those, however many devices the license had before.
    index("activations_license_device").on(t.licenseId, t.status, t.deviceThumbprint),
  ],
);

/**
 * Device-proof nonces seen within the clock-skew window, so a replay is refused even after a
 * restart. Rows arrive in time order, so the integer key (the rowid) is their age order and the
 * purge deletes from the front of the table: each call writes its nonce to the key index (a
 * random page) and appends to the table (a page the calls of one commit share). Migration 0020
 * replaced a WITHOUT ROWID table whose seen_at index sorted a second's nonces by activation id,
 * a second random page per call.
 */
export const deviceNonces = sqliteTable(
  "device_nonces",
  {
    id: integer("id").primaryKey(),
    activationId: text("activation_id").notNull(),
    nonce: text("nonce").notNull(),
    seenAt: integer("seen_at").notNull(),
  },
  (t) => [uniqueIndex("device_nonces_key").on(t.activationId, t.nonce)],
);

export const leases = sqliteTable(
  "leases",
  {
    id: text("id").primaryKey(),
    licenseId: text("license_id")
      .notNull()
      .references(() => licenses.id),
    activationId: text("activation_id")
      .notNull()
      .references(() => activations.id),
    instanceId: text("instance_id").notNull(),
    status: text("status", { enum: ["active", "released"] }).notNull(),
    createdAt: timestamp("created_at").notNull(),
    expiresAt: timestamp("expires_at").notNull(),
    releasedAt: timestamp("released_at"),
  },
  (t) => [
    index("leases_license_status").on(t.licenseId, t.status, t.expiresAt),
    // Lease acquire checks what this activation already holds; without it, a scan of every lease.
    index("leases_activation_status").on(t.activationId, t.status, t.expiresAt),
  ],
);

/** Rejected runtime requests, one row per (target, operation, code, hour) (spec §6.2). */
export const runtimeEvents = sqliteTable(
  "runtime_events",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    hour: integer("hour").notNull(),
    operation: text("operation").notNull(),
    code: text("code").notNull(),
    httpStatus: integer("http_status").notNull(),
    productId: text("product_id"),
    licenseId: text("license_id"),
    activationId: text("activation_id"),
    detailsOmitted: integer("details_omitted", { mode: "boolean" }).notNull(),
    occurrences: integer("occurrences").notNull(),
    firstOccurredAt: timestamp("first_occurred_at").notNull(),
    lastOccurredAt: timestamp("last_occurred_at").notNull(),
    lastRequestId: text("last_request_id").notNull(),
    /** (hour, operation, code, product, license, activation, omitted) joined: the aggregation key. */
    bucket: text("bucket").notNull(),
  },
  (t) => [
    uniqueIndex("runtime_events_bucket").on(t.bucket),
    index("runtime_events_env_last").on(t.environment, t.lastOccurredAt),
    index("runtime_events_hour").on(t.hour),
  ],
);

/** The vendor's device-risk policy: a blocked device key or license is refused at the runtime API. */
export const deviceBlocks = sqliteTable(
  "device_blocks",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    kind: text("kind", { enum: ["device_key", "license"] }).notNull(),
    /** A device signing key thumbprint, or a license id. */
    target: text("target").notNull(),
    reason: text("reason"),
    createdAt: timestamp("created_at").notNull(),
    /** Set when the block is lifted: the row stays, so lifting it again is a harmless repeat. */
    removedAt: timestamp("removed_at"),
  },
  // One block in force per target; lifted ones stay beside it.
  (t) => [
    uniqueIndex("device_blocks_target").on(t.environment, t.kind, t.target).where(sql`removed_at IS NULL`),
  ],
);
