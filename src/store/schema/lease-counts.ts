import { integer, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { licenses } from "./licenses.ts";

/**
 * Leases with status 'active' per license (expired or not), kept by triggers on `leases`
 * (migration 0016_lease_counts). A lease acquire asks this one row first: fewer such leases than
 * the license's concurrency limit means a free seat without counting the live ones, which on a
 * license with thousands of floating seats was a scan per acquire (~1 ms at 10k leases).
 */
export const leaseCounts = sqliteTable("lease_counts", {
  licenseId: text("license_id")
    .primaryKey()
    .references(() => licenses.id),
  active: integer("active").notNull().default(0),
});
