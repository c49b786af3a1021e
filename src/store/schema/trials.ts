import { index, integer, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { policies, products } from "./catalog.ts";
import { timestamp } from "./columns.ts";
import { licenses } from "./licenses.ts";

/** A product's trial sign-up settings (spec §4.3 rule 3); no row means no policy chosen. */
export const trialSignups = sqliteTable("trial_signups", {
  productId: text("product_id")
    .primaryKey()
    .references(() => products.id),
  policyId: text("policy_id").references(() => policies.id),
  dailyLimit: integer("daily_limit").notNull(),
  updatedAt: timestamp("updated_at").notNull(),
});

/**
 * One trial verification start. Addresses are kept only as an HMAC (`emailLookup`): the confirm
 * carries the address again, and the send limits compare lookups. `sent` is false when the start
 * was answered but no code went out (product not accepting, a send limit): such a verification
 * exists like any other, and no code ever matches it.
 */
export const trialVerifications = sqliteTable(
  "trial_verifications",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    productId: text("product_id")
      .notNull()
      .references(() => products.id),
    emailLookup: text("email_lookup").notNull(),
    deviceThumbprint: text("device_thumbprint").notNull(),
    codeHash: text("code_hash").notNull(),
    attempts: integer("attempts").notNull().default(0),
    sent: integer("sent", { mode: "boolean" }).notNull(),
    status: text("status", { enum: ["started", "used"] }).notNull(),
    createdAt: timestamp("created_at").notNull(),
    expiresAt: timestamp("expires_at").notNull(),
    usedAt: timestamp("used_at"),
  },
  (t) => [
    index("trial_verifications_email").on(t.emailLookup, t.createdAt),
    index("trial_verifications_created").on(t.createdAt),
  ],
);

/**
 * Every device a sign-up put on a trial license: `started` made the license, `joined` added a
 * device to the active trial of the same address. The 365-day reuse window and the 24-hour
 * `daily_limit` read this table.
 */
export const trialGrants = sqliteTable(
  "trial_grants",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    productId: text("product_id")
      .notNull()
      .references(() => products.id),
    licenseId: text("license_id")
      .notNull()
      .references(() => licenses.id),
    kind: text("kind", { enum: ["started", "joined"] }).notNull(),
    emailLookup: text("email_lookup").notNull(),
    deviceThumbprint: text("device_thumbprint").notNull(),
    verificationId: text("verification_id").notNull(),
    createdAt: timestamp("created_at").notNull(),
  },
  (t) => [
    index("trial_grants_product_email").on(t.productId, t.emailLookup, t.createdAt),
    index("trial_grants_product_device").on(t.productId, t.deviceThumbprint, t.createdAt),
    index("trial_grants_product_created").on(t.productId, t.kind, t.createdAt),
  ],
);
