import { sql } from "drizzle-orm";
import { index, integer, sqliteTable, text, uniqueIndex } from "drizzle-orm/sqlite-core";
import { products } from "./catalog.ts";
import { timestamp } from "./columns.ts";

/**
 * Public halves and lifecycle of product signing keys; the private halves live in the keystore
 * under `product-signing:<key_id>`.
 */
export const signingKeys = sqliteTable(
  "signing_keys",
  {
    keyId: text("key_id").primaryKey(),
    productId: text("product_id")
      .notNull()
      .references(() => products.id),
    publicKey: text("public_key").notNull(),
    status: text("status", { enum: ["active", "retired", "compromised"] }).notNull(),
    /** Unix seconds, as they appear in the trust bundle. */
    notBefore: integer("not_before").notNull(),
    notAfter: integer("not_after"),
    createdAt: timestamp("created_at").notNull(),
    retiredAt: timestamp("retired_at"),
  },
  (t) => [
    index("signing_keys_product").on(t.productId),
    // The bundle names one active key and the server signs with one: two would be a rotation
    // half done (migration 0030).
    uniqueIndex("signing_keys_one_active").on(t.productId).where(sql`status = 'active'`),
  ],
);

/** The current signed trust bundle of each product, rebuilt whenever its keys change. */
export const trustBundles = sqliteTable("trust_bundles", {
  productId: text("product_id")
    .primaryKey()
    .references(() => products.id),
  sequence: integer("sequence").notNull(),
  /** JCS of the bundle, exactly as signed. */
  bundle: text("bundle").notNull(),
  rootSignature: text("root_signature").notNull(),
  issuedAt: timestamp("issued_at").notNull(),
});
