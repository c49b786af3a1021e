import { canonicalLicenseKey } from "../domain/license-key.ts";

/** One JSON object per line on stderr. Never give it secrets: callers pass only named fields. */
export type LogLevel = "debug" | "info" | "warn" | "error";

export interface Logger {
  log(level: LogLevel, msg: string, fields?: Record<string, unknown>): void;
}

const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export function jsonLogger(
  minimum: LogLevel = "info",
  write = (line: string) => process.stderr.write(line),
): Logger {
  return {
    log(level, msg, fields = {}) {
      if (ORDER[level] < ORDER[minimum]) return;
      write(`${JSON.stringify({ ts: new Date().toISOString(), level, msg, ...fields })}\n`);
    },
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
