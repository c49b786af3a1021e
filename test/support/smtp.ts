import { SMTPServer, type SMTPServerOptions } from "smtp-server";
import type { Deps } from "../../src/deps.ts";
import { silentLogger } from "../../src/http/logger.ts";
import { smtpTransport } from "../../src/mail/transport.ts";
import { MailWorker } from "../../src/mail/worker.ts";

/** One message as the SMTP server received it. */
export interface ReceivedMail {
  from: string;
  to: string[];
  /** The whole message as sent (headers and MIME body, CRLF line ends). */
  raw: string;
  subject: string;
  /** The verification code, read from the subject (templates start it with the code). */
  code: string | null;
  /** The passkey approval link, when the mail has one. */
  approvalUrl: string | null;
  /** Which credentials the client logged in with, if any. */
  user: string | null;
  /** Whether the session was encrypted (implicit TLS or STARTTLS). */
  secure: boolean;
}

export interface TestSmtpServer {
  /** For LICENSING_SMTP_URL / smtpTransport. */
  url: string;
  port: number;
  messages: ReceivedMail[];
  /** The next mail to `to` not yet returned by an earlier wait. */
  waitForMail(to: string, timeoutMs?: number): Promise<ReceivedMail>;
  /** The code of the next mail to `to`. */
  waitForCode(to: string, timeoutMs?: number): Promise<string>;
  /** While down, every message is refused with a temporary 451 (an outage the client must retry). */
  setDown(down: boolean): void;
  stop(): Promise<void>;
}

export interface SmtpOptions {
  /** Implicit TLS (smtps://) with smtp-server's built-in self-signed certificate. */
  secure?: boolean;
  /** Require AUTH PLAIN/LOGIN with these credentials (STARTTLS first, unless `secure`). */
  auth?: { user: string; pass: string };
  /** Fixed port, e.g. to bring a server back where a client already points. */
  port?: number;
  /** Recipients refused for good at RCPT TO (550, quoting the address, as servers do). */
  refuseRecipients?: string[];
}

const decodeSubject = (raw: string): string => {
  const match = /^Subject: (.*(?:\r\n[ \t].*)*)/m.exec(raw);
  if (!match?.[1]) return "";
  return match[1]
    .replace(/\r\n[ \t]/g, " ")
    .replace(/=\?utf-8\?([QB])\?([^?]*)\?=/gi, (_, enc: string, text: string) =>
      enc.toUpperCase() === "B"
        ? Buffer.from(text, "base64").toString("utf8")
        : Buffer.from(
            text
              .replace(/_/g, " ")
              .replace(/=([0-9A-F]{2})/gi, (_m, hex: string) =>
                String.fromCharCode(Number.parseInt(hex, 16)),
              ),
            "latin1",
          ).toString("utf8"),
    );
};

/** Undoes quoted-printable soft breaks and escapes, enough to find a URL in the text part. */
const unQuotedPrintable = (raw: string): string =>
  raw
    .replace(/=\r?\n/g, "")
    .replace(/=([0-9A-F]{2})/g, (_m, hex: string) => String.fromCharCode(Number.parseInt(hex, 16)));

/** A real SMTP server on 127.0.0.1 (smtp-server from npm) that keeps every message it accepts. */
export async function startSmtpServer(options: SmtpOptions = {}): Promise<TestSmtpServer> {
  const messages: ReceivedMail[] = [];
  const waiters: { to: string; resolve: (mail: ReceivedMail) => void }[] = [];
  const taken = new Set<ReceivedMail>();
  let down = false;

  const settle = () => {
    for (const waiter of [...waiters]) {
      const mail = messages.find((m) => !taken.has(m) && m.to.includes(waiter.to.toLowerCase()));
      if (!mail) continue;
      taken.add(mail);
      waiters.splice(waiters.indexOf(waiter), 1);
      waiter.resolve(mail);
    }
  };

  const serverOptions: SMTPServerOptions = {
    secure: options.secure ?? false,
    authOptional: !options.auth,
    // Without credentials a plain server: nodemailer would otherwise upgrade to the built-in,
    // self-signed certificate and refuse it.
    disabledCommands: options.auth ? [] : options.secure ? ["AUTH"] : ["AUTH", "STARTTLS"],
    logger: false,
    onAuth(auth, _session, callback) {
      if (options.auth && auth.username === options.auth.user && auth.password === options.auth.pass) {
        callback(null, { user: auth.username });
      } else {
        callback(new Error("Invalid username or password"));
      }
    },
    onRcptTo(address, _session, callback) {
      if (options.refuseRecipients?.includes(address.address.toLowerCase())) {
        const error = new Error(
          `5.1.1 <${address.address}>: Recipient address rejected: User unknown`,
        ) as Error & {
          responseCode: number;
        };
        error.responseCode = 550;
        callback(error);
        return;
      }
      callback();
    },
    onData(stream, session, callback) {
      const chunks: Buffer[] = [];
      stream.on("data", (chunk: Buffer) => chunks.push(chunk));
      stream.on("end", () => {
        if (down) {
          const error = new Error("Temporary failure, try again later") as Error & { responseCode: number };
          error.responseCode = 451;
          callback(error);
          return;
        }
        const raw = Buffer.concat(chunks).toString("utf8");
        const subject = decodeSubject(raw);
        const approval = /https?:\/\/[^\s"<>]+\/passkeys\/v1\/approve#[^\s"<>]+/.exec(unQuotedPrintable(raw));
        messages.push({
          from: session.envelope.mailFrom ? session.envelope.mailFrom.address : "",
          to: session.envelope.rcptTo.map((r) => r.address.toLowerCase()),
          raw,
          subject,
          code: /^(\d{6})\b/.exec(subject)?.[1] ?? null,
          approvalUrl: approval ? approval[0] : null,
          user: typeof session.user === "string" ? session.user : null,
          secure: session.secure,
        });
        callback();
        settle();
      });
    },
  };
  const server = new SMTPServer(serverOptions);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, "127.0.0.1", () => resolve());
  });
  const address = server.server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  const scheme = options.secure ? "smtps" : "smtp";
  const auth = options.auth
    ? `${encodeURIComponent(options.auth.user)}:${encodeURIComponent(options.auth.pass)}@`
    : "";
  const query = options.secure || options.auth ? "?tls_insecure=true" : "";

  const waitForMail = (to: string, timeoutMs = 5_000) =>
    new Promise<ReceivedMail>((resolve, reject) => {
      const timer = setTimeout(() => {
        waiters.splice(waiters.indexOf(waiter), 1);
        reject(new Error(`no mail to ${to} within ${timeoutMs} ms`));
      }, timeoutMs);
      const waiter = {
        to,
        resolve: (mail: ReceivedMail) => {
          clearTimeout(timer);
          resolve(mail);
        },
      };
      waiters.push(waiter);
      settle();
    });

  return {
    url: `${scheme}://${auth}127.0.0.1:${port}${query}`,
    port,
    messages,
    waitForMail,
    async waitForCode(to, timeoutMs) {
      const mail = await waitForMail(to, timeoutMs);
      if (!mail.code) throw new Error(`the mail to ${to} has no code: ${mail.subject}`);
      return mail.code;
    },
    setDown(value) {
      down = value;
    },
    stop: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/**
 * Delivers a test context's outbox to an SMTP URL, polling every 20 ms (the app's own services are
 * not reachable from a test, so there is no enqueue nudge). Returns the stop function.
 */
export function deliverMail(
  deps: Pick<Deps, "db" | "clock" | "secrets">,
  smtpUrl: string,
  options: { retryDelaysSec?: number[] } = {},
): () => Promise<void> {
  const worker = new MailWorker(deps, smtpTransport(smtpUrl), {
    from: "Licensing <licensing@example.test>",
    logger: silentLogger,
    pollMs: 20,
    retryDelaysSec: options.retryDelaysSec,
  });
  return worker.start();
}
