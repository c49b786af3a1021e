import { randomBytes } from "node:crypto";
import { mkdir, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import nodemailer from "nodemailer";
import type Mail from "nodemailer/lib/mailer";

export interface OutgoingMail {
  /** The outbox row id: the Message-ID and the .eml file name derive from it, so a resend is recognisable. */
  id: string;
  from: string;
  to: string;
  subject: string;
  text: string;
  html: string;
}

export interface MailTransport {
  /** `smtp` or `file`, and where to, without credentials: safe to log. */
  readonly description: string;
  send(mail: OutgoingMail): Promise<void>;
  close(): void;
}

export const DEFAULT_MAIL_FROM = "Licensing <licensing@localhost>";

const message = (mail: OutgoingMail): Mail.Options => ({
  from: mail.from,
  // An address object, never a string: nodemailer parses a string as a header value and would
  // read `x<victim@example.com>` as the name x and the mailbox victim@example.com, or a comma as
  // two recipients. As an object it is one mailbox, whatever the stored text holds.
  to: { name: "", address: mail.to },
  subject: mail.subject,
  text: mail.text,
  html: mail.html,
  messageId: `<${mail.id}@licensing.invalid>`,
});

/** The SMTP URL without its password, for logs and error messages. */
export function redactSmtpUrl(smtpUrl: string): string {
  try {
    const url = new URL(smtpUrl);
    if (url.password) url.password = "***";
    url.search = "";
    return url.toString();
  } catch {
    return "smtp://(unparseable)";
  }
}

/**
 * How long one SMTP send may take in all, connection included. The socket timeout below is an
 * idle timeout: a server that keeps the connection busy (a tarpit sending a continuation line
 * every few seconds) never trips it, and the worker sends one mail at a time, so without an
 * overall deadline one such server would hold every later mail back for good.
 */
export const SMTP_SEND_DEADLINE_MS = 60_000;

export interface SmtpTransportOptions {
  /** Overrides {@link SMTP_SEND_DEADLINE_MS}; tests use a short one. */
  sendDeadlineMs?: number;
}

/**
 * `smtp://` upgrades with STARTTLS whenever the server offers it (`?require_tls=true` refuses a
 * server that does not); `smtps://` is TLS from the first byte. User and password come from the
 * URL's userinfo (percent-encoded). `?tls_insecure=true` skips certificate checks, for test
 * servers with self-signed certificates only.
 */
export function smtpTransport(smtpUrl: string, options: SmtpTransportOptions = {}): MailTransport {
  const sendDeadlineMs = options.sendDeadlineMs ?? SMTP_SEND_DEADLINE_MS;
  const url = new URL(smtpUrl);
  const secure = url.protocol === "smtps:";
  const transporter = nodemailer.createTransport({
    host: url.hostname.replace(/^\[|\]$/g, ""),
    port: url.port ? Number(url.port) : secure ? 465 : 587,
    secure,
    requireTLS: url.searchParams.get("require_tls") === "true",
    auth: url.username
      ? { user: decodeURIComponent(url.username), pass: decodeURIComponent(url.password) }
      : undefined,
    tls: { rejectUnauthorized: url.searchParams.get("tls_insecure") !== "true" },
    connectionTimeout: 10_000,
    greetingTimeout: 10_000,
    socketTimeout: 30_000,
    // nodemailer's own logger would print the AUTH exchange; we log named fields only.
    logger: false,
    debug: false,
  });
  return {
    description: redactSmtpUrl(smtpUrl),
    async send(mail) {
      // Past the deadline nodemailer closes the connection and rejects with EABORT; the worker
      // retries later like any failed send. The server may have taken the message already: the
      // retry carries the same Message-ID, as after a crash.
      await transporter.sendMail({ ...message(mail), signal: AbortSignal.timeout(sendDeadlineMs) });
    },
    close: () => transporter.close(),
  };
}

/**
 * The default when no SMTP server is configured: each mail becomes `<dir>/<id>.eml`, so a fresh
 * install works without a mail server and an operator can read (or forward) what would have gone
 * out. Written to a random temp name (created exclusively) and renamed, so a reader never sees
 * half a file and a resend after a crash replaces rather than duplicates. Asynchronous and without
 * fsync: the worker sends beside requests, only after a start that mails, and a synchronous
 * flush there held the thread for the disk's time after exactly those starts, which made them
 * tell apart from silent ones (the verification-timing bench caught it).
 */
export function fileTransport(dir: string): MailTransport {
  const transporter = nodemailer.createTransport({ streamTransport: true, buffer: true, newline: "windows" });
  return {
    description: `file:${dir}`,
    async send(mail) {
      const info = await transporter.sendMail(message(mail));
      await mkdir(dir, { recursive: true, mode: 0o700 });
      const target = join(dir, `${mail.id}.eml`);
      const temporary = join(dir, `.${mail.id}-${randomBytes(6).toString("hex")}.tmp`);
      try {
        // 0600: a mail may hold a sign-in code or a claim link.
        await writeFile(temporary, info.message as Buffer, { mode: 0o600, flag: "wx" });
        await rename(temporary, target);
      } catch (error) {
        await rm(temporary, { force: true });
        throw error;
      }
    },
    close: () => transporter.close(),
  };
}

export interface MailTransportConfig {
  smtpUrl: string | null;
  /** `<data>/outbox`, used when there is no SMTP URL. */
  outboxDir: string;
}

export const createMailTransport = (config: MailTransportConfig): MailTransport =>
  config.smtpUrl ? smtpTransport(config.smtpUrl) : fileTransport(config.outboxDir);
