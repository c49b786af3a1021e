import { index, integer, sqliteTable, text } from "drizzle-orm/sqlite-core";
import { timestamp } from "./columns.ts";

/**
 * The durable mail outbox. A row is written in the same transaction as whatever the mail reports
 * (a verification code, say), so an answer the API gave is never without its mail even when the
 * process dies right after; the worker sends rows and retries them with backoff.
 */
export const mailOutbox = sqliteTable(
  "mail_outbox",
  {
    id: text("id").primaryKey(),
    template: text("template").notNull(),
    locale: text("locale").notNull(),
    recipient: text("recipient").notNull(),
    /** The template data (it holds codes), encrypted with the data key; cleared once sent. */
    payload: text("payload"),
    /** `suppressed`: written only so that a start that sends nothing costs what one that sends does. */
    status: text("status", { enum: ["pending", "sent", "failed", "suppressed"] }).notNull(),
    attempts: integer("attempts").notNull().default(0),
    nextAttemptAt: timestamp("next_attempt_at").notNull(),
    lastError: text("last_error"),
    createdAt: timestamp("created_at").notNull(),
    sentAt: timestamp("sent_at"),
  },
  (t) => [index("mail_outbox_due").on(t.status, t.nextAttemptAt)],
);
