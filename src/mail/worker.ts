import { and, asc, eq, gt, inArray, lt, lte } from "drizzle-orm";
import type { Deps } from "../deps.ts";
import type { Logger } from "../http/logger.ts";
import { RepeatedFailureLog } from "../jobs/repeated-failure-log.ts";
import { mailOutbox } from "../store/schema/index.ts";
import { purgeInSteps } from "../store/stepped-count.ts";
import { type MailOutbox, mailPayloadContext } from "./outbox.ts";
import { isMailTemplateName, renderMail } from "./templates.ts";
import type { MailTransport } from "./transport.ts";

/** Seconds before the 1st, 2nd, ... retry; after the last, the mail is marked failed (about a day in all). */
export const MAIL_RETRY_DELAYS_SEC = [10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14_400, 28_800, 43_200];
const BATCH = 20;
const POLL_MS = 2_000;
/** Finished rows (sent, failed, suppressed) are kept this long for operators, then deleted. */
export const MAIL_RETENTION_SEC = 7 * 86_400;
/** Outbox rows read (and at most deleted) per statement by the purge. */
export const MAIL_PURGE_BATCH = 1_000;
const PURGE_EVERY_MS = 3_600_000;

export interface MailWorkerOptions {
  from: string;
  logger: Logger;
  retryDelaysSec?: readonly number[];
  pollMs?: number;
  /** Tests only: the monotonic milliseconds the failure log's minute is measured in. */
  monotonicMs?: () => number;
}

/**
 * Sends what the outbox holds, oldest due first, one mail at a time. A failed send (SMTP down,
 * refused, timed out) is retried with backoff; the row stays the source of truth throughout, so a
 * restart picks up exactly where the last process stopped. A crash between sending and marking
 * sent resends that one mail: the same Message-ID, which receivers can deduplicate.
 */
export class MailWorker {
  private running: Promise<number> | null = null;
  private again = false;
  private readonly retryDelays: readonly number[];
  /** A store that fails every poll (a full disk) is logged once a minute, not every 2 s. */
  private readonly failures: RepeatedFailureLog;

  constructor(
    private readonly deps: Pick<Deps, "db" | "clock" | "secrets">,
    private readonly transport: MailTransport,
    private readonly options: MailWorkerOptions,
  ) {
    this.retryDelays = options.retryDelaysSec ?? MAIL_RETRY_DELAYS_SEC;
    this.failures = new RepeatedFailureLog(options.logger, {
      failed: "mail worker failed",
      recovered: "mail worker recovered",
      nowMs: options.monotonicMs,
    });
  }

  /** One poll as the timer and the outbox's wake-up make it: a failure is logged, never thrown. */
  poll(): Promise<void> {
    return this.runOnce().then(
      () => this.failures.succeeded(),
      (error: unknown) => this.failures.failed(error),
    );
  }

  /** Sends every due mail; resolves with how many were sent. Calls made meanwhile join the run and trigger one more. */
  runOnce(): Promise<number> {
    if (this.running) {
      this.again = true;
      return this.running;
    }
    this.running = (async () => {
      let sent = 0;
      try {
        do {
          this.again = false;
          sent += await this.sendDue();
        } while (this.again);
      } finally {
        this.running = null;
      }
      return sent;
    })();
    return this.running;
  }

  /** Polls, and sends at once whenever the outbox gets a row. Returns a stop function that waits for the current send. */
  start(outbox?: MailOutbox): () => Promise<void> {
    const kick = () => {
      void this.poll();
    };
    const unsubscribe = outbox?.onEnqueue(kick) ?? (() => false);
    const timer = setInterval(kick, this.options.pollMs ?? POLL_MS);
    timer.unref?.();
    let purging = false;
    const purge = () => {
      if (purging) return;
      purging = true;
      this.purge()
        .catch((error: Error) =>
          this.options.logger.log("error", "mail purge failed", { error: error.message }),
        )
        .finally(() => {
          purging = false;
        });
    };
    const purgeTimer = setInterval(purge, PURGE_EVERY_MS);
    purgeTimer.unref?.();
    purge();
    kick();
    return async () => {
      unsubscribe();
      clearInterval(timer);
      clearInterval(purgeTimer);
      // Bounded: an SMTP server that hangs must not hold up a shutdown; the row stays pending.
      await Promise.race([this.running?.catch(() => 0), Bun.sleep(5_000)]);
      this.transport.close();
    };
  }

  /**
   * Deletes finished rows older than the retention; returns how many. The outbox has no index on
   * `created_at`, so the purge walks the primary key `batch` rows at a time (one short statement
   * each, as the lease retention does) and deletes what each window holds that may go, with a
   * turn of the event loop between windows: one DELETE of a backlog held every heartbeat up.
   */
  purge(batch = MAIL_PURGE_BATCH): Promise<number> {
    const before = new Date(this.deps.clock.now().getTime() - MAIL_RETENTION_SEC * 1000);
    const { db } = this.deps;
    let cursor = "";
    return purgeInSteps(() => {
      const last = db
        .select({ id: mailOutbox.id })
        .from(mailOutbox)
        .where(gt(mailOutbox.id, cursor))
        .orderBy(asc(mailOutbox.id))
        .limit(batch)
        .all()
        .at(-1)?.id;
      if (last === undefined) return null;
      const purged = db
        .delete(mailOutbox)
        .where(
          and(
            gt(mailOutbox.id, cursor),
            lte(mailOutbox.id, last),
            inArray(mailOutbox.status, ["sent", "failed", "suppressed"]),
            lt(mailOutbox.createdAt, before),
          ),
        )
        .returning({ id: mailOutbox.id })
        .all().length;
      cursor = last;
      return purged;
    });
  }

  private async sendDue(): Promise<number> {
    const now = this.deps.clock.now();
    const due = this.deps.db
      .select()
      .from(mailOutbox)
      .where(and(eq(mailOutbox.status, "pending"), lte(mailOutbox.nextAttemptAt, now)))
      .orderBy(asc(mailOutbox.nextAttemptAt), asc(mailOutbox.id))
      .limit(BATCH)
      .all();
    let sent = 0;
    for (const row of due) {
      try {
        if (!isMailTemplateName(row.template) || row.payload === null) throw new Error("unknown template");
        const data = JSON.parse(this.deps.secrets.decrypt(row.payload, mailPayloadContext(row.id)));
        const rendered = renderMail(row.template, row.locale, data);
        await this.transport.send({ id: row.id, from: this.options.from, to: row.recipient, ...rendered });
      } catch (error) {
        this.failed(row.id, row.attempts + 1, error as Error);
        continue;
      }
      this.deps.db
        .update(mailOutbox)
        .set({ status: "sent", payload: null, sentAt: this.deps.clock.now(), attempts: row.attempts + 1 })
        .where(eq(mailOutbox.id, row.id))
        .run();
      this.options.logger.log("info", "mail sent", { mail_id: row.id, template: row.template });
      sent++;
    }
    // A full batch means more may be due.
    if (due.length === BATCH) this.again = true;
    return sent;
  }

  private failed(id: string, attempts: number, error: Error): void {
    const delay = this.retryDelays[attempts - 1];
    // The message of an SMTP error names the server's reply, never our credentials; cut it short anyway.
    const lastError = (error.message || error.name).slice(0, 300);
    const now = this.deps.clock.now().getTime();
    // A recipient the server refuses for good (5xx at RCPT: no such user, mailbox disabled) is not
    // tried again for a day: the code it carries has long expired by then. Other 5xx replies (a
    // wrong SMTP password, a relay refused) are the operator's to fix, and the mail waits for it.
    const refusedForGood = recipientRefusedForGood(error);
    const giveUp = delay === undefined || refusedForGood;
    // ±10% jitter, so mail held back by one outage does not all return in the same second.
    const jittered = giveUp ? 0 : delay * 1000 * (0.9 + Math.random() * 0.2);
    this.deps.db
      .update(mailOutbox)
      .set(
        giveUp
          ? { status: "failed", payload: null, attempts, lastError }
          : { attempts, lastError, nextAttemptAt: new Date(now + Math.round(jittered)) },
      )
      .where(eq(mailOutbox.id, id))
      .run();
    this.options.logger.log(giveUp ? "error" : "warn", giveUp ? "mail given up" : "mail send failed", {
      mail_id: id,
      attempts,
      transport: this.transport.description,
      // The server's reply often quotes the recipient: the log keeps the reply, not the address.
      error: withoutAddresses(lastError),
      ...(refusedForGood ? { reason: "recipient_refused" } : {}),
    });
  }
}

/** nodemailer's error for a message every recipient of which the server refused with a 5xx. */
function recipientRefusedForGood(error: Error): boolean {
  const { responseCode, command } = error as Error & { responseCode?: unknown; command?: unknown };
  return (
    command === "RCPT TO" && typeof responseCode === "number" && responseCode >= 500 && responseCode < 600
  );
}

const withoutAddresses = (text: string): string =>
  text.replace(/(?<![^\s<>"'()[\],;:])[^\s<>"'()[\],;:]+@[^\s<>"'()[\],;:]+/g, "<address>");
