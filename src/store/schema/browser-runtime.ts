import { integer, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { products } from "./catalog.ts";
import { timestamp } from "./columns.ts";

/**
 * Browser runtime settings of a product (spec §4.3 rule 2). No row means the defaults: disabled,
 * no origins. The concurrency token is the product's own `version`, bumped by every change here.
 */
export const browserRuntimeSettings = sqliteTable("browser_runtime_settings", {
  productId: text("product_id")
    .primaryKey()
    .references(() => products.id),
  enabled: integer("enabled", { mode: "boolean" }).notNull(),
  /** JSON array of canonical origins (scheme://host[:port], lower case, punycode, default port elided). */
  allowedOrigins: text("allowed_origins", { mode: "json" }).$type<string[]>().notNull(),
  updatedAt: timestamp("updated_at").notNull(),
});
