import { integer, primaryKey, sqliteTable, text } from "drizzle-orm/sqlite-core";

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
