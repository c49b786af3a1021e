import { sql } from "drizzle-orm";
import { check, index, integer, primaryKey, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { timestamp } from "./columns.ts";

/** A self-hosted install serves exactly one workspace; the row is created by `licensing init`. */
export const workspace = sqliteTable(
  "workspace",
  {
    id: text("id").primaryKey(),
    name: text("name").notNull(),
    planCode: text("plan_code").notNull(),
    /** When the workspace plan ends (402 PLAN_ENDED afterwards); null: it does not end. */
    planEndsAt: timestamp("plan_ends_at"),
    /** The plan is a trial (reported as `plan.trial`). */
    planTrial: integer("plan_trial", { mode: "boolean" }).notNull().default(false),
    /**
     * The base URL the last `licensing serve` on this store ran with: the service's address for
     * command-line commands given none (a webhook URL to show, an offline package's issuer).
     */
    baseUrl: text("base_url"),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
  },
  (t) => [check("workspace_single_row", sql`${t.id} = 'default'`)],
);

export const apiKeys = sqliteTable(
  "api_keys",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    name: text("name").notNull(),
    scopes: text("scopes", { mode: "json" }).$type<string[]>().notNull(),
    /** SHA-256 hex of the whole key; the key itself is shown once and never stored. */
    tokenHash: text("token_hash").notNull().unique(),
    /** First characters of the key, so an operator can tell keys apart in `keys list`. */
    tokenHint: text("token_hint").notNull(),
    createdAt: timestamp("created_at").notNull(),
    revokedAt: timestamp("revoked_at"),
    lastUsedAt: timestamp("last_used_at"),
    usageCount: integer("usage_count").notNull().default(0),
  },
  (t) => [index("api_keys_environment").on(t.environment)],
);

/** Metered usage per calendar month (UTC), e.g. ("management_requests", "2026-11"). */
export const usageCounters = sqliteTable(
  "usage_counters",
  {
    metric: text("metric").notNull(),
    period: text("period").notNull(),
    count: integer("count").notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.metric, t.period] })],
);
