import { sql } from "drizzle-orm";
import { index, integer, sqliteTable, text, uniqueIndex } from "drizzle-orm/sqlite-core";
import { timestamp } from "./columns.ts";

/**
 * Named users of licenses (spec §4.2 rules 6-8): local-ID users identified by email, per
 * environment, their assignments to licenses, their second factor, the email verifications that
 * prove an address and the single-use tokens those produce.
 */
export const licenseUsers = sqliteTable(
  "license_users",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    email: text("email").notNull(),
    /** Lowercased and trimmed: addresses are unique among active users of an environment by this form. */
    emailNormalized: text("email_normalized").notNull(),
    name: text("name"),
    externalRef: text("external_ref"),
    customerId: text("customer_id"),
    status: text("status", { enum: ["active", "disabled"] }).notNull(),
    /** TOTP: `none`, `pending` (enrolled, not yet confirmed with a code) or `enabled`. */
    totpStatus: text("totp_status", { enum: ["none", "pending", "enabled"] }).notNull(),
    /** The TOTP secret, encrypted with the data key (context `license_users:<id>:totp`). */
    totpSecret: text("totp_secret"),
    /** The last accepted TOTP time step: a step is never accepted twice. */
    totpLastStep: integer("totp_last_step"),
    /** Wrong second factors in a row; at the threshold the user is locked until a vendor unlocks. */
    secondFactorFailures: integer("second_factor_failures").notNull().default(0),
    twoFactorLockedAt: timestamp("two_factor_locked_at"),
    revision: integer("revision").notNull().default(1),
    createdAt: timestamp("created_at").notNull(),
    updatedAt: timestamp("updated_at").notNull(),
    disabledAt: timestamp("disabled_at"),
  },
  (t) => [
    uniqueIndex("license_users_active_email")
      .on(t.environment, t.emailNormalized)
      .where(sql`status = 'active'`),
    index("license_users_env_id").on(t.environment, t.id),
  ],
);

/** Recovery codes: HMACs only, each usable once. */
export const recoveryCodes = sqliteTable(
  "two_factor_recovery_codes",
  {
    userId: text("user_id")
      .notNull()
      .references(() => licenseUsers.id),
    codeHash: text("code_hash").notNull(),
    usedAt: timestamp("used_at"),
  },
  (t) => [uniqueIndex("recovery_codes_user_hash").on(t.userId, t.codeHash)],
);

export const licenseAssignments = sqliteTable(
  "license_assignments",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    licenseId: text("license_id").notNull(),
    userId: text("user_id")
      .notNull()
      .references(() => licenseUsers.id),
    status: text("status", { enum: ["active", "removed"] }).notNull(),
    createdAt: timestamp("created_at").notNull(),
    removedAt: timestamp("removed_at"),
  },
  (t) => [
    uniqueIndex("license_assignments_active").on(t.licenseId, t.userId).where(sql`status = 'active'`),
    index("license_assignments_user").on(t.userId, t.status),
    index("license_assignments_license").on(t.licenseId, t.id),
  ],
);

export const emailVerifications = sqliteTable(
  "email_verifications",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    productId: text("product_id").notNull(),
    /** HMAC of product, license key and address: a newer start with the same one replaces this one. */
    subjectHash: text("subject_hash").notNull(),
    /** Set only when rule 6 held and a code was sent. */
    licenseId: text("license_id"),
    userId: text("user_id"),
    assignmentId: text("assignment_id"),
    deviceThumbprint: text("device_thumbprint").notNull(),
    codeHash: text("code_hash").notNull(),
    attempts: integer("attempts").notNull().default(0),
    /** Wrong codes among the attempts (not second factors): the subject's budget counts them across its counted verifications. */
    codeFailures: integer("code_failures").notNull().default(0),
    /**
     * HMAC of the address (lookup key), one mailbox across environments: the mailbox limits count
     * by it. Rows written before it was one keyed it with the environment; older ones have none.
     */
    addressHash: text("address_hash"),
    /** Whether a code was mailed (rule 6 held and the send limits allowed). */
    sent: integer("sent", { mode: "boolean" }).notNull().default(false),
    /**
     * Whether the subject's send limit let this start through, whether or not the address had a
     * user: the subject's limits, its wrong-code budget and which open verification a held-back
     * start leaves open all go by this, never by `sent`, so none of them tells an address with a
     * user from one without (limits.ts).
     */
    counted: integer("counted", { mode: "boolean" }).notNull().default(false),
    expiresAt: timestamp("expires_at").notNull(),
    closedAt: timestamp("closed_at"),
    closedReason: text("closed_reason", { enum: ["used", "replaced"] }),
    createdAt: timestamp("created_at").notNull(),
    /**
     * When a newer start for the same subject last wrote this one while it was open (closing it,
     * or, held back by the subject's limit, leaving the counted one open). SQLite does not write a row
     * rewritten unchanged: without a changed value a held-back start wrote one page fewer than a
     * sending one, which its timing gave away.
     */
    latestStartAt: timestamp("latest_start_at"),
  },
  (t) => [
    index("email_verifications_subject").on(t.subjectHash, t.closedAt),
    index("email_verifications_subject_counted").on(t.subjectHash, t.counted, t.createdAt),
    index("email_verifications_address").on(t.addressHash, t.createdAt),
    index("email_verifications_created").on(t.createdAt),
  ],
);

export const namedUserTokens = sqliteTable(
  "named_user_tokens",
  {
    /** HMAC of the token; the token itself is only ever in the response. */
    tokenHash: text("token_hash").primaryKey(),
    verificationId: text("verification_id").notNull(),
    licenseId: text("license_id").notNull(),
    userId: text("user_id").notNull(),
    assignmentId: text("assignment_id").notNull(),
    deviceThumbprint: text("device_thumbprint").notNull(),
    expiresAt: timestamp("expires_at").notNull(),
    usedAt: timestamp("used_at"),
  },
  (t) => [index("named_user_tokens_expires").on(t.expiresAt)],
);

/** Which assignment a named-user activation holds: heartbeats check it is still active (rule 1). */
export const namedUserActivations = sqliteTable("named_user_activations", {
  activationId: text("activation_id").primaryKey(),
  assignmentId: text("assignment_id").notNull(),
});

/** Passkeys (WebAuthn credentials) of license users: a second factor through an emailed approval link. */
export const passkeys = sqliteTable(
  "passkeys",
  {
    id: text("id").primaryKey(),
    userId: text("user_id")
      .notNull()
      .references(() => licenseUsers.id),
    /** base64url of the credential id the authenticator chose. */
    credentialId: text("credential_id").notNull(),
    /** `{ alg, jwk }`: the public key only. */
    publicKey: text("public_key", { mode: "json" })
      .$type<{ alg: -7 | -8; jwk: Record<string, string> }>()
      .notNull(),
    signCount: integer("sign_count").notNull(),
    createdAt: timestamp("created_at").notNull(),
    lastUsedAt: timestamp("last_used_at"),
  },
  (t) => [uniqueIndex("passkeys_credential").on(t.credentialId), index("passkeys_user").on(t.userId)],
);

/** Single-use links a vendor sends a user to register a passkey; only an HMAC of the token is kept. */
export const passkeyRegistrations = sqliteTable(
  "passkey_registrations",
  {
    tokenHash: text("token_hash").primaryKey(),
    userId: text("user_id").notNull(),
    challenge: text("challenge"),
    expiresAt: timestamp("expires_at").notNull(),
    usedAt: timestamp("used_at"),
  },
  // Links are ended per user (a new link, two-factor off, an address change) and purged by age.
  (t) => [
    index("passkey_registrations_user").on(t.userId),
    index("passkey_registrations_expiry").on(t.expiresAt),
  ],
);

/**
 * Passkey approval of one email verification (spec §4.2 rule 7): the link's secret (HMAC), the
 * WebAuthn challenge while a ceremony runs, and the approval code it produced (HMAC), single use.
 */
export const passkeyApprovals = sqliteTable("passkey_approvals", {
  verificationId: text("verification_id").primaryKey(),
  secretHash: text("secret_hash").notNull(),
  challenge: text("challenge"),
  codeHash: text("code_hash"),
  usedAt: timestamp("used_at"),
});
