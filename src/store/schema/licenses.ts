import { index, integer, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { policies, products } from "./catalog.ts";
import { timestamp } from "./columns.ts";
import { customers } from "./parties.ts";

export const licenses = sqliteTable(
  "licenses",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    productId: text("product_id")
      .notNull()
      .references(() => products.id),
    policyId: text("policy_id")
      .notNull()
      .references(() => policies.id),
    customerId: text("customer_id").references(() => customers.id),
    /** The key encrypted with the keystore's data key; `keyLookup` is its HMAC for finding it. */
    keyCiphertext: text("key_ciphertext").notNull(),
    keyLookup: text("key_lookup").notNull().unique(),
    licenseType: text("license_type").notNull(),
    /** Stored state; `expired` is derived from `expiresAt` at read time so it never goes stale. */
    status: text("status", { enum: ["active", "suspended", "revoked"] }).notNull(),
    statusReason: text("status_reason"),
    expiresAt: timestamp("expires_at"),
    renewalAuthority: text("renewal_authority").notNull(),
    maxMachinesOverride: integer("max_machines_override"),
    maxConcurrentOverride: integer("max_concurrent_override"),
    licenseUnitLimitOverride: integer("license_unit_limit_override"),
    entitlements: text("entitlements", { mode: "json" }).$type<Record<string, unknown>>().notNull(),
    metadata: text("metadata", { mode: "json" }).$type<Record<string, unknown>>().notNull(),
    version: integer("version").notNull().default(1),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
    suspendedAt: timestamp("suspended_at"),
    revokedAt: timestamp("revoked_at"),
    convertedAt: timestamp("converted_at"),
    /**
     * The `expires_at` whose passing was announced (`license.expired`), by the expiry scan or by the
     * change that ended the license at once. A later change to the row (metadata, suspension) does
     * not touch it, so it cannot hide an expiry not yet announced; a new expiry differs from it and is
     * announced again when it passes (migration 0029).
     */
    expiryAnnounced: timestamp("expiry_announced"),
  },
  (t) => [
    index("licenses_env_id").on(t.environment, t.id),
    // The list's filters, newest first: without them a product or customer with few licenses
    // was found by walking every license of the environment (~0.5 s a page at a million).
    index("licenses_env_product").on(t.environment, t.productId, t.id),
    index("licenses_env_customer").on(t.environment, t.customerId, t.id),
    // The usage report's licenses active at a moment, counted from this index alone: from the
    // table it read every row (~0.5 s at a million), with everything else waiting.
    index("licenses_env_lifetime").on(t.environment, t.createdAt, t.revokedAt, t.suspendedAt, t.expiresAt),
    index("licenses_policy").on(t.policyId),
    // The license.expired scan every 30 s reads the licenses whose expiry just passed (migration
    // 0023); without it, the whole table every time, while an endpoint is subscribed.
    index("licenses_expires").on(t.expiresAt),
  ],
);
