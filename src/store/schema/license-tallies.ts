import { index, integer, primaryKey, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { timestamp } from "./columns.ts";

/**
 * Licenses that are not revoked, per environment and license type, kept by triggers on `licenses`
 * (migration 0036_license_tallies), so no code path can forget it. The plan's quotas are asked on
 * every license create and shown by GET /mgmt/v1/plan: counted from `licenses`, that was a scan of
 * every live license each time (about a second at a million, with everything else waiting).
 * Never write licenses with `INSERT OR REPLACE`: without recursive triggers the replaced row's
 * delete trigger does not fire and the tally would count it twice (`ON CONFLICT DO UPDATE` is fine).
 */
export const licenseTallies = sqliteTable(
  "license_tallies",
  {
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    licenseType: text("license_type").notNull(),
    unrevoked: integer("unrevoked").notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.environment, t.licenseType] })],
);

/**
 * What a license's suspension and expiry were before a change, kept by a trigger on `licenses`
 * (migration 0043_license_state_history): the usage report's `active_licenses` for a past month
 * asks whether each license was suspended or expired at the month's end, and a reinstatement or a
 * renewal since overwrote the answer in `licenses`. Only the first change of each calendar month
 * (UTC, of `updated_at`) is kept per license: a month end's state is the one before the first
 * change after it, so later changes in the same month add nothing (a monthly renewal is one row a
 * month). `license_id` is not a foreign key: the row outlives nothing it refers to.
 */
export const licenseStateHistory = sqliteTable(
  "license_state_history",
  {
    licenseId: text("license_id").notNull(),
    changedAt: timestamp("changed_at").notNull(),
    suspendedAt: timestamp("suspended_at"),
    expiresAt: timestamp("expires_at"),
  },
  (t) => [
    primaryKey({ columns: [t.licenseId, t.changedAt] }),
    // Whether any license changed after a moment: a report of the current month skips the history.
    index("license_state_history_changed").on(t.changedAt),
  ],
);
