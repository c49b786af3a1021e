import { sql } from "drizzle-orm";
import { index, integer, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { timestamp } from "./columns.ts";

/** Customers and resellers are shared by the live and test environments (spec 2.4). */
export const customers = sqliteTable(
  "customers",
  {
    id: text("id").primaryKey(),
    name: text("name"),
    email: text("email"),
    externalRef: text("external_ref"),
    notes: text("notes"),
    status: text("status", { enum: ["active", "archived"] }).notNull(),
    revision: integer("revision").notNull().default(1),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
    archivedAt: timestamp("archived_at"),
  },
  // The list's email filter compares case-insensitively (`lower(email) = lower(?)`), which an
  // index on the plain column cannot serve: every filtered list read the whole table until
  // migration 0024 put the index on the expression the filter uses.
  (t) => [
    index("customers_email_lower").on(sql`lower(${t.email})`),
    // Each Stripe checkout finds its buyer by the Stripe customer id kept here (billing/buyers.ts):
    // without it, a scan of every customer per purchase (migration 0041).
    index("customers_external_ref").on(t.externalRef),
  ],
);

export const resellers = sqliteTable("resellers", {
  id: text("id").primaryKey(),
  name: text("name").notNull(),
  email: text("email"),
  externalRef: text("external_ref"),
  status: text("status", { enum: ["active", "suspended", "archived"] }).notNull(),
  organizationLimit: integer("organization_limit"),
  userLimit: integer("user_limit"),
  metadata: text("metadata", { mode: "json" }).$type<Record<string, unknown>>().notNull(),
  revision: integer("revision").notNull().default(1),
  createdAt: timestamp("created_at").notNull(),
  updatedAt: timestamp("updated_at").notNull(),
  archivedAt: timestamp("archived_at"),
});
