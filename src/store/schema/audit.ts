import { index, integer, primaryKey, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { timestamp } from "./columns.ts";

export type Actor =
  | { type: "api_key"; id: string; name: string }
  /**
   * The command line: `id` is the user's name as the environment gives it ($USER), a claim anyone
   * running the command can set; `uid` is the process's user id, which they cannot. No `uid`
   * where the system has none (Windows) and in events recorded before it was kept.
   */
  | { type: "cli"; id: string; uid?: number }
  /** A billing provider's webhook acting for a buyer (`id` is the provider, e.g. `stripe`). */
  | { type: "billing"; id: string }
  /** A device acting through the Runtime API, e.g. a trial sign-up (`id` is its signing-key thumbprint). */
  | { type: "device"; id: string }
  /** A license user acting through a link the vendor sent them (a passkey registration). */
  | { type: "license_user"; id: string }
  | { type: "system" };

export const auditEvents = sqliteTable(
  "audit_events",
  {
    id: text("id").primaryKey(),
    environment: text("environment", { enum: ["live", "test"] }).notNull(),
    type: text("type").notNull(),
    actor: text("actor", { mode: "json" }).$type<Actor>().notNull(),
    targetType: text("target_type").notNull(),
    targetId: text("target_id").notNull(),
    data: text("data", { mode: "json" }).$type<Record<string, unknown>>().notNull(),
    requestId: text("request_id"),
    createdAt: timestamp("created_at").notNull(),
  },
  (t) => [index("audit_events_env_id").on(t.environment, t.id)],
);

/** One row per (caller, method, route, Idempotency-Key); the row is claimed before any work starts. */
export const idempotencyRecords = sqliteTable(
  "idempotency_records",
  {
    scope: text("scope").notNull(),
    method: text("method").notNull(),
    route: text("route").notNull(),
    idempotencyKey: text("idempotency_key").notNull(),
    fingerprint: text("fingerprint").notNull(),
    state: text("state", { enum: ["in_flight", "completed"] }).notNull(),
    responseStatus: integer("response_status"),
    responseBody: text("response_body"),
    responseHeaders: text("response_headers", { mode: "json" }).$type<Record<string, string>>(),
    createdAt: timestamp("created_at").notNull(),
    expiresAt: timestamp("expires_at").notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.scope, t.method, t.route, t.idempotencyKey] }),
    index("idempotency_expires").on(t.expiresAt),
  ],
);
