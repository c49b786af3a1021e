import { integer, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { licenses } from "./licenses.ts";

/**
 * Active activations per license, kept by triggers on `activations` (migration
 * 0011_activation_counts), so no code path can forget it. Activation asks "is there a free
 * slot?" first of this one row: a license below its machine limit needs no count of its devices,
 * which on a site license with thousands of them was a scan per activation.
 */
export const activationCounts = sqliteTable("activation_counts", {
  licenseId: text("license_id")
    .primaryKey()
    .references(() => licenses.id),
  active: integer("active").notNull().default(0),
});
