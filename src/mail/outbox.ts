import { randomInt } from "node:crypto";
import type { Deps } from "../deps.ts";
import type { Db } from "../store/db.ts";
import { mailOutbox } from "../store/schema/index.ts";
import type { MailTemplateName } from "./templates.ts";

/** A transaction handle or the database itself. */
type Writer = Pick<Db, "insert">;

export interface MailRequest {
  to: string;
  template: MailTemplateName;
  locale?: string;
  data: Record<string, string>;
}

/** New mail wakes the worker after 50-500 ms: prompt for a person, unrelated to the request. */
const wakeDelayMs = () => 50 + randomInt(450);

/** The payload's encryption context: binds the ciphertext to its row. */
export const mailPayloadContext = (id: string): string => `mail_outbox:${id}`;

/**
 * Puts mail into the durable outbox. `enqueue` writes inside the caller's transaction, so the mail
 * exists exactly when the change it reports was committed; the worker (worker.ts) sends it.
 */
export class MailOutbox {
  private readonly listeners = new Set<() => void>();

  constructor(private readonly deps: Pick<Deps, "clock" | "ids" | "secrets">) {}

  /**
   * Writes the row with the caller's writer and returns its id; the worker is nudged after the
   * current task. `suppressed` does all the same work, and writes a row as large (the encrypted
   * payload included), but the row is never sent: for answers that must not reveal, even by their
   * timing, whether a mail went out. The payload of a suppressed verification mail holds a code
   * the verification refuses anyway (it matched nobody, or is held back), under the data key.
   */
  enqueue(tx: Writer, mail: MailRequest, options: { suppressed?: boolean } = {}): string {
    const now = this.deps.clock.now();
    const id = `mail_${this.deps.ids.ulid(now.getTime())}`;
    const payload = this.deps.secrets.encrypt(JSON.stringify(mail.data), mailPayloadContext(id));
    tx.insert(mailOutbox)
      .values({
        id,
        template: mail.template,
        locale: mail.locale ?? "",
        recipient: mail.to,
        payload,
        status: options.suppressed ? "suppressed" : "pending",
        attempts: 0,
        nextAttemptAt: now,
        createdAt: now,
      })
      .run();
    // Later, on a timer of its own, never within this request: a microtask would run the
    // worker's rendering and encryption before the answer is sent, so a start that sends a code
    // would answer measurably slower than one that does not (docs/performance.md, verification
    // timing). The random delay also keeps the sending from lining up with the next request.
    // By then the caller's transaction has committed (or rolled back: the worker finds nothing).
    if (this.listeners.size > 0 && !options.suppressed) setTimeout(() => this.notify(), wakeDelayMs());
    return id;
  }

  /** The worker subscribes to send new mail at once instead of at its next poll. */
  onEnqueue(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private notify(): void {
    for (const listener of this.listeners) listener();
  }
}
