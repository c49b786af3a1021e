import { writeSync } from "node:fs";
import { canonicalLicenseKey } from "../domain/license-key.ts";

/** One JSON object per line on stderr. Never give it secrets: callers pass only named fields. */
export type LogLevel = "debug" | "info" | "warn" | "error";

export interface Logger {
  log(level: LogLevel, msg: string, fields?: Record<string, unknown>): void;
}

const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export function jsonLogger(
  minimum: LogLevel = "info",
  write: (line: string, urgent: boolean) => void = stderrLines(),
): Logger {
  return {
    log(level, msg, fields = {}) {
      if (ORDER[level] < ORDER[minimum]) return;
      write(
        `${JSON.stringify({ ts: new Date().toISOString(), level, msg, ...fields })}\n`,
        ORDER[level] >= ORDER.warn,
      );
    },
  };
}

/**
 * Lines to stderr, gathered and written once per turn of the event loop: one line per request
 * written on its own cost a write and a stream round trip per request, a tenth of a heartbeat.
 * Warnings and errors are not held back (a line that says why the process is about to die must
 * get out), and what is pending is written synchronously when the process exits. A kill -9 can
 * lose the request lines of the current turn, never an error.
 */
export function stderrLines(fd = 2): (line: string, urgent: boolean) => void {
  let pending: string[] = [];
  const flush = () => {
    if (pending.length === 0) return;
    const text = pending.join("");
    pending = [];
    try {
      writeSync(fd, text);
    } catch {
      // stderr closed (a detached process): nothing sensible to do with a log line.
    }
  };
  process.on("exit", flush);
  return (line, urgent) => {
    if (pending.length === 0 && !urgent) setImmediate(flush);
    pending.push(line);
    if (urgent) flush();
  };
}

export const silentLogger: Logger = { log() {} };

const API_KEY_LIKE = /lsk_[A-Za-z0-9_]*/;

/**
 * The path as it goes into a log line. Clients sometimes put a secret in the URL (a license key
 * where an id belongs, an API key pasted into the path); a segment that looks like either is
 * replaced, so the request is still traceable but the log never holds the secret.
 */
export function redactPath(path: string): string {
  return path
    .split("/")
    .map((segment) => {
      let decoded = segment;
      try {
        decoded = decodeURIComponent(segment);
      } catch {
        // Not valid percent-encoding: judged as sent.
      }
      if (API_KEY_LIKE.test(decoded)) return "[redacted-api-key]";
      if (canonicalLicenseKey(decoded) !== null) return "[redacted-license-key]";
      return segment;
    })
    .join("/");
}
