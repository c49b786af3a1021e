import { sql } from "drizzle-orm";
import { blob, index, integer, sqliteTable, text, uniqueIndex } from "drizzle-orm/sqlite-core";
import { products } from "./catalog.ts";
import { timestamp } from "./columns.ts";
import { licenses } from "./licenses.ts";
import { activations } from "./runtime.ts";

/** A sealing key's `status` (below); the API's `keys[].status` lists the same values. */
export const SEALING_KEY_STATUSES = ["active", "retired", "compromised"] as const;

/**
 * Public halves and lifecycle of product sealing keys (P-256, DESIGN §5 "Sealed file"); the
 * private halves live in the keystore under `product-sealing:<key_id>`. A product has sealed files
 * enabled once it has an active key; nothing turns them off (spec §3.2). Every `active` key
 * releases data keys; exactly one of them is the product's current key, the one new files are
 * sealed to (`licensing sealing-keys rotate` makes a new one current, the older ones keep
 * releasing until `retire`).
 */
export const sealingKeys = sqliteTable(
  "sealing_keys",
  {
    keyId: text("key_id").primaryKey(),
    productId: text("product_id")
      .notNull()
      .references(() => products.id),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    /** `p256:<b64u 65-byte point>`. */
    publicKey: text("public_key").notNull(),
    /**
     * `active`: releases data keys; `retired`: no longer does, its private half stays in the
     * keystore; `compromised`: never again, and its private half is removed from the keystore.
     */
    status: text("status", { enum: SEALING_KEY_STATUSES }).notNull(),
    /**
     * The product's current key: the one the status route shows and new files are sealed to.
     * Only an active key is current; the partial unique index keeps it to one per product, so two
     * rotations racing cannot leave a product with two current keys.
     */
    isCurrent: integer("is_current", { mode: "boolean" }).notNull().default(false),
    createdAt: timestamp("created_at").notNull(),
    retiredAt: timestamp("retired_at"),
  },
  (t) => [
    index("sealing_keys_product").on(t.productId),
    uniqueIndex("sealing_keys_one_current").on(t.productId).where(sql`is_current = 1`),
  ],
);

/**
 * Every offline package issued, with its exact bytes: an identical device request is answered
 * with the same bytes while the package stays eligible (docs/api.md "Offline packages").
 */
export const offlinePackages = sqliteTable(
  "offline_packages",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    productId: text("product_id")
      .notNull()
      .references(() => products.id),
    licenseId: text("license_id")
      .notNull()
      .references(() => licenses.id),
    activationId: text("activation_id")
      .notNull()
      .references(() => activations.id),
    /**
     * hex SHA-256 of the string the request's device proof signs: what "an identical device
     * request" means, whatever spelling of the proof came with it. Rows issued before that rule
     * hold SHA-256 of JCS(request), proof included (request.ts `formerIdentity`).
     */
    requestSha256: text("request_sha256").notNull(),
    /** The `expires_at` the vendor asked for; null when the default applied. */
    requestedExpiresAt: timestamp("requested_expires_at"),
    assignmentId: text("assignment_id"),
    signingKeyId: text("signing_key_id").notNull(),
    issuedAt: timestamp("issued_at").notNull(),
    expiresAt: timestamp("expires_at").notNull(),
    packageSha256: text("package_sha256").notNull(),
    body: blob("body", { mode: "buffer" }).notNull(),
  },
  (t) => [
    uniqueIndex("offline_packages_request").on(t.licenseId, t.requestSha256),
    index("offline_packages_activation").on(t.activationId),
    // A rotation's default retention reads the retiring key's unexpired packages while it holds
    // the write lock (trust/retention.ts): a seek, not a scan of every package and its body.
    index("offline_packages_signing_key").on(t.signingKeyId, t.expiresAt),
  ],
);
