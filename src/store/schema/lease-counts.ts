import { integer, primaryKey, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { timestamp } from "./columns.ts";
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

/**
 * Seats held at each month start (UTC) per environment: the usage report's `active_leases` for a
 * past month. Finished leases are deleted after their retention (src/modules/leases/retention.ts),
 * so a past month's count cannot be read from the leases table for ever; it is counted once, after
 * the month ended and before any lease it counts may be deleted, and the report reads it from here.
 * The count at a past moment no longer changes (a new lease starts later, a release or renewal
 * happens later), so the stored number is the one the table gave.
 */
export const leaseMonthCounts = sqliteTable(
  "lease_month_counts",
  {
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    at: timestamp("at").notNull(),
    active: integer("active").notNull(),
  },
  (t) => [primaryKey({ columns: [t.environment, t.at] })],
);

/**
 * The month start being counted into `lease_month_counts`, while its count is under way: the
 * count walks the leases table along its id index a chunk per step (src/modules/leases/
 * month-counts.ts), and this row keeps where it stopped and what it has counted so far, so a
 * restart resumes the count instead of starting over. At most one row; none when no count is
 * under way.
 */
export const leaseMonthCountProgress = sqliteTable("lease_month_count_progress", {
  at: timestamp("at").primaryKey(),
  /** The last lease id read ("" before the first chunk). */
  afterId: text("after_id").notNull(),
  /** The last lease id when the count began: the walk ends there. */
  throughId: text("through_id").notNull(),
  live: integer("live").notNull(),
  test: integer("test").notNull(),
});
