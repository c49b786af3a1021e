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
      // The line of JSON.stringify({ ts, level, msg, ...fields }), without copying the fields
      // into a new object first (one line per request).
      const rest = JSON.stringify(fields);
      const ts = new Date().toISOString();
      const line =
        rest === "{}"
          ? `{"ts":"${ts}","level":"${level}","msg":${JSON.stringify(msg)}}`
          : rest?.startsWith("{")
            ? `{"ts":"${ts}","level":"${level}","msg":${JSON.stringify(msg)},${rest.slice(1)}`
            : // Fields that do not serialise to an object (a toJSON of their own): the plain way.
              JSON.stringify({ ts, level, msg, ...fields });
      write(`${line}\n`, ORDER[level] >= ORDER.warn);
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
export function stderrLines(
  fd = 2,
  write: (fd: number, bytes: Uint8Array) => number = writeSync,
): (line: string, urgent: boolean) => void {
  let pending: string[] = [];
  const out = new LineWriter(fd, write);
  const flush = () => {
    if (pending.length === 0) return;
    const bytes = Buffer.from(pending.join(""));
    pending = [];
    out.write(bytes);
  };
  process.on("exit", flush);
  return (line, urgent) => {
    if (pending.length === 0 && !urgent) setImmediate(flush);
    pending.push(line);
    if (urgent) flush();
  };
}

const pause = new Int32Array(new SharedArrayBuffer(4));
/** How long one flush may wait for a pipe whose reader is behind (it holds the only thread). */
const MAX_WAIT_MS = 100;

/**
 * Every byte, in order, while stderr takes them: a write to a pipe may take only part of them, or
 * none for a moment (EAGAIN, a non-blocking pipe whose reader is behind), and the rest of a line
 * written later would be cut off by the next. A flush waits at most MAX_WAIT_MS for a reader
 * that takes nothing; once one gave up, later flushes wait for nothing (each would hold every request
 * up) and drop their lines until a write goes through again, which first ends the line cut off.
 */
class LineWriter {
  /** A flush gave up: the reader is stuck, and the last line out may be cut off. */
  private stuck = false;
  private midLine = false;

  constructor(
    private readonly fd: number,
    private readonly writeTo: (fd: number, bytes: Uint8Array) => number,
  ) {}

  write(bytes: Uint8Array): void {
    if (this.midLine && !this.writeAll(Buffer.from("\n"))) return;
    this.writeAll(bytes);
  }

  /** False when it gave up; what it wrote of `bytes` then is cut off mid-line. */
  private writeAll(bytes: Uint8Array): boolean {
    let offset = 0;
    let waited = 0;
    while (offset < bytes.length) {
      let written = 0;
      try {
        written = this.writeTo(this.fd, bytes.subarray(offset));
      } catch (error) {
        // stderr closed (a detached process): nothing sensible to do with a log line.
        if ((error as { code?: string }).code !== "EAGAIN") return this.gaveUp(offset > 0);
      }
      if (written > 0) {
        offset += written;
        this.stuck = false;
        waited = 0;
        continue;
      }
      if (this.stuck || waited++ >= MAX_WAIT_MS) return this.gaveUp(offset > 0);
      Atomics.wait(pause, 0, 0, 1);
    }
    this.midLine = false;
    return true;
  }

  private gaveUp(cutOff: boolean): false {
    this.stuck = true;
    if (cutOff) this.midLine = true;
    return false;
  }
}

export const silentLogger: Logger = { log() {} };

/**
 * The path as it goes into a log line. Clients sometimes put a secret in the URL (a license key
 * where an id belongs, an API key pasted into the path); a segment that looks like either is
 * replaced, so the request is still traceable but the log never holds the secret.
 *
 * It runs for every request, so the common segment costs little: it is decoded only when it holds
 * a '%', and the full license-key recognition runs only when the segment could be one (see
 * mayBeLicenseKey). A path with nothing to replace is returned as it came, without a copy.
 */
export function redactPath(path: string): string {
  let out: string | null = null;
  let start = 0;
  while (start <= path.length) {
    let end = path.indexOf("/", start);
    if (end === -1) end = path.length;
    const segment = path.slice(start, end);
    const replacement = redactedSegment(segment);
    if (replacement !== null && out === null) out = path.slice(0, start);
    if (out !== null) out += (replacement ?? segment) + (end < path.length ? "/" : "");
    start = end + 1;
  }
  return out ?? path;
}

/**
 * The longest path a request's log line holds. A client chooses its path (16,000 characters made
 * a 16 KB line per request): past this it is cut, after redaction (so a secret is never cut into
 * a part redaction would not recognize), and says so and how long it was.
 */
export const MAX_LOGGED_PATH = 512;

/** The path as the request log line holds it: redacted, then cut to MAX_LOGGED_PATH characters. */
export function loggedPath(path: string): string {
  const redacted = redactPath(path);
  if (redacted.length <= MAX_LOGGED_PATH) return redacted;
  return `${redacted.slice(0, MAX_LOGGED_PATH)}…[cut: ${redacted.length} characters]`;
}

/** The replacement of one path segment, or null when it is kept. */
function redactedSegment(segment: string): string | null {
  let decoded = segment;
  if (segment.includes("%")) {
    try {
      decoded = decodeURIComponent(segment);
    } catch {
      // Not valid percent-encoding: judged as sent.
    }
  }
  // An API key is `lsk_` and then anything: the prefix alone marks the segment.
  if (decoded.includes("lsk_")) return "[redacted-api-key]";
  if (mayBeLicenseKey(decoded) && canonicalLicenseKey(decoded) !== null) return "[redacted-license-key]";
  return null;
}

/**
 * Any ASCII character but whitespace, '-', letters other than U and digits: those survive
 * canonicalLicenseKey's folding (dashes and whitespace dropped, upper-cased, I/L to 1, O to 0) as
 * something outside the key alphabet. Non-ASCII code units are let through, since some upper-case
 * to key characters (U+0131 dotless i to I) or are whitespace (U+00A0).
 */
const NEVER_IN_KEY = /[^\s0-9A-TV-Za-tv-z\u0080-\uffff-]/;

/**
 * A cheap necessary condition for canonicalLicenseKey accepting `text`: long enough (folding only
 * removes characters) and no character that folding keeps outside the alphabet. Most segments
 * (ids like `act_…`, route words) fail it; test/unit/logger-redaction.test.ts checks that no
 * spelling of a real key does.
 */
function mayBeLicenseKey(text: string): boolean {
  return text.length >= 25 && !NEVER_IN_KEY.test(text);
}
