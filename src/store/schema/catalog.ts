import { index, integer, sqliteTable, text, uniqueIndex } from "drizzle-orm/sqlite-core";
import { timestamp } from "./columns.ts";

export const products = sqliteTable(
  "products",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    name: text("name").notNull(),
    code: text("code").notNull(),
    description: text("description").notNull().default(""),
    status: text("status", { enum: ["active", "archived"] }).notNull(),
    trustBundleSequence: integer("trust_bundle_sequence").notNull().default(0),
    /**
     * The oldest bundle sequence still safe to accept: the first bundle, or the first one that
     * listed the latest key declared compromised (an older bundle would still trust it). A
     * rotation does not raise it, so apps built with a newer config keep loading offline packages
     * that carry the bundle of their issue. The integration config's minimum_trust_bundle_sequence.
     */
    trustBundleMinimumSequence: integer("trust_bundle_minimum_sequence").notNull().default(0),
    signingStatus: text("signing_status", { enum: ["pending", "ready"] }).notNull(),
    version: integer("version").notNull().default(1),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
    archivedAt: timestamp("archived_at"),
  },
  (t) => [
    uniqueIndex("products_environment_code").on(t.environment, t.code),
    index("products_env_id").on(t.environment, t.id),
  ],
);

export const policies = sqliteTable(
  "policies",
  {
    id: text("id").primaryKey(),
    productId: text("product_id")
      .notNull()
      .references(() => products.id),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    name: text("name").notNull(),
    /** The spec's policy `version`: a historical number shown to people, not a concurrency token. */
    policyNumber: integer("policy_number").notNull().default(1),
    /** Concurrency revision behind the opaque ETag. */
    revision: integer("revision").notNull().default(1),
    status: text("status", { enum: ["active", "retired"] }).notNull(),
    licenseType: text("license_type").notNull(),
    validationMode: text("validation_mode").notNull(),
    failMode: text("fail_mode").notNull(),
    identityMode: text("identity_mode").notNull(),
    perpetualMode: text("perpetual_mode").notNull(),
    concurrencyUnit: text("concurrency_unit").notNull(),
    renewalAuthority: text("renewal_authority").notNull(),
    billingCycle: text("billing_cycle").notNull(),
    fingerprintProfile: text("fingerprint_profile").notNull(),
    heartbeatRequired: integer("heartbeat_required", { mode: "boolean" }).notNull(),
    maxMachines: integer("max_machines").notNull(),
    maxConcurrent: integer("max_concurrent"),
    licenseUnitLimit: integer("license_unit_limit"),
    certTtlSec: integer("cert_ttl_sec").notNull(),
    heartbeatSec: integer("heartbeat_sec").notNull(),
    leaseTtlSec: integer("lease_ttl_sec").notNull(),
    leaseHeartbeatSec: integer("lease_heartbeat_sec").notNull(),
    networkGraceSec: integer("network_grace_sec").notNull(),
    trialDays: integer("trial_days").notNull(),
    entitlements: text("entitlements", { mode: "json" }).$type<Record<string, unknown>>().notNull(),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
    retiredAt: timestamp("retired_at"),
  },
  (t) => [index("policies_env_id").on(t.environment, t.id), index("policies_product").on(t.productId)],
);
