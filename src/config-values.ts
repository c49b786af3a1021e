import { isIP } from "node:net";
import { UsageError } from "./cli/args.ts";
import { ipv6Groups } from "./domain/ip-address.ts";
import type { LogLevel } from "./http/logger.ts";
import type { RateLimitSetting } from "./http/rate-limit.ts";
import { CONTROL_CHARACTERS } from "./http/schemas.ts";

/**
 * The parsers of single configuration values: each takes the text of one flag or environment
 * variable and the name it came by (for the usage error), and returns the value or refuses it.
 * Apart from config.ts, which knows the options, their precedence and defaults, because none of
 * these needs more than its one value; like config.ts, pure and unit-tested through it.
 */

const LOG_LEVELS: readonly LogLevel[] = ["debug", "info", "warn", "error"];

export function parsePort(value: string, source: string): number {
  const port = /^\d{1,5}$/.test(value) ? Number(value) : Number.NaN;
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new UsageError(`${source} must be a port number from 1 to 65535, not "${value}"`);
  }
  return port;
}

export function validateHost(host: string, source: string): string {
  if (/\s|\/|^\[|\]$/.test(host)) {
    throw new UsageError(
      `${source} must be a hostname or IP address without brackets, not "${redactUserinfo(host)}"`,
    );
  }
  // The default base URL is made from it: a host no URL can hold (999.1.1.1, an IPv6 typo) is
  // refused here, naming the setting, not later as a bare "Invalid URL". So is one the URL would
  // read as more than a host (`user:pw@h` puts credentials in it, `h?x` a query).
  const url = URL.canParse(`http://${hostForUrl(host)}/`) ? new URL(`http://${hostForUrl(host)}/`) : null;
  if (!url || url.username || url.password || url.pathname !== "/" || url.search || url.hash) {
    throw new UsageError(`${source} must be a hostname or IP address, not "${redactUserinfo(host)}"`);
  }
  return host;
}

/**
 * True when a URL's hostname is the unspecified address, which a listener takes as "every
 * interface": 0.0.0.0, ::, or ::ffff:0.0.0.0 (IPv4-mapped: an IPv6 socket bound to it accepts on
 * every IPv4 interface). The URL parser has already read the IPv4 spellings the way the system
 * does (`0`, `0x0`, `000.0.0.0`, `0.0.0.0.`), so the address is judged by its value, not its text.
 * Hostnames are left alone: what they resolve to is the resolver's business at listen time.
 */
export function isUnspecifiedAddress(hostname: string): boolean {
  const address = hostname.replace(/^\[(.*)\]$/, "$1");
  const version = isIP(address);
  if (version === 4) return address.split(".").every((part) => Number(part) === 0);
  if (version !== 6) return false;
  const groups = ipv6Groups(address);
  if (!groups) return false;
  return groups.every((group, i) => group === 0 || (i === 5 && group === 0xffff));
}

/** IPv6 literals need brackets inside a URL. */
export const hostForUrl = (host: string): string => (host.includes(":") ? `[${host}]` : host);

/**
 * What was given, for an error message, with anything that may be a user and password (what
 * stands between the scheme and the last `@`) replaced: the value did not parse, so where its
 * credentials end is a guess, and the guess errs towards hiding more.
 */
function redactUserinfo(value: string): string {
  const at = value.lastIndexOf("@");
  if (at === -1) return value;
  const scheme = value.indexOf("://");
  const start = scheme !== -1 && scheme < at ? scheme + 3 : 0;
  return `${value.slice(0, start)}***@${value.slice(at + 1)}`;
}

export function parseBaseUrl(value: string, source: string): string {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new UsageError(`${source} must be an absolute http(s) URL, not "${redactUserinfo(value)}"`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    // Without `//` what was read as the scheme may be a user name (`admin:pw@host`).
    const scheme = value.startsWith(`${url.protocol}//`) ? `, not ${url.protocol}` : "";
    throw new UsageError(`${source} must use http or https${scheme}`);
  }
  if (url.search || url.hash || url.username || url.password) {
    throw new UsageError(`${source} must not carry a query, fragment or credentials`);
  }
  // Error doc_url and certificate issuers append paths to it, so no trailing slash.
  return `${url.origin}${url.pathname}`.replace(/(?<!\/)\/+$/, "");
}

export function parseSmtpUrl(value: string, source: string): string {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new UsageError(`${source} must be an smtp:// or smtps:// URL`);
  }
  if (url.protocol !== "smtp:" && url.protocol !== "smtps:") {
    // Without `//` what was read as the scheme may be a user name (`admin:pw@host`).
    const scheme = value.startsWith(`${url.protocol}//`) ? `, not ${url.protocol}` : "";
    throw new UsageError(`${source} must be an smtp:// or smtps:// URL${scheme}`);
  }
  if (!url.hostname) throw new UsageError(`${source} must name the SMTP server's host`);
  // The transport decodes user and password (mail/transport.ts); a bad escape is refused here,
  // before anything is started, and without echoing them.
  try {
    decodeURIComponent(url.username);
    decodeURIComponent(url.password);
  } catch {
    throw new UsageError(
      `${source} has a user or password that is not valid percent-encoding (e.g. %40 for @)`,
    );
  }
  return value;
}

export function parseMailFrom(value: string, source: string): string {
  const from = value.trim();
  // Either a bare address or `Name <address>`; the mailer does the full RFC 5322 parsing. It goes
  // into a header: a line break would start headers of its own (`x\r\nBcc: …`), so no control
  // characters anywhere, and the whole value is one of the two forms, not merely ending like one.
  if (
    new RegExp(`[${CONTROL_CHARACTERS}]`).test(from) ||
    !/^(?:[^\s@<>]+@[^\s@<>]+|[^<>]*<[^\s@<>]+@[^\s@<>]+>)$/.test(from)
  ) {
    throw new UsageError(
      `${source} must be one line with an email address, e.g. licensing@example.com or Licensing <licensing@example.com>`,
    );
  }
  return from;
}

/** A short token could be guessed by anyone who can reach the port; one with spaces cannot be sent as a bearer token. */
export function parseMetricsToken(value: string, source: string): string {
  if (!/^[\x21-\x7E]{16,256}$/.test(value)) {
    throw new UsageError(`${source} must be 16 to 256 visible ASCII characters without spaces`);
  }
  return value;
}

/** `N/SEC` (N requests per SEC seconds, in bursts of up to N) or `off`. */
export function parseRateLimit(value: string, source: string): RateLimitSetting | null {
  const text = value.trim().toLowerCase();
  if (text === "off") return null;
  const match = /^(\d{1,10})\/(\d{1,6})$/.exec(text);
  const limit = Number(match?.[1]);
  const windowSec = Number(match?.[2]);
  if (!match || limit < 1 || limit > 1_000_000_000 || windowSec < 1 || windowSec > 86_400) {
    throw new UsageError(
      `${source} must be N/SEC (1 to 1000000000 requests per 1 to 86400 seconds) or off, not "${value}"`,
    );
  }
  return { limit, windowSec };
}

export function parseLogLevel(value: string, source: string): LogLevel {
  const level = value.toLowerCase();
  if (!(LOG_LEVELS as readonly string[]).includes(level)) {
    throw new UsageError(`${source} must be one of ${LOG_LEVELS.join(", ")}, not "${value}"`);
  }
  return level as LogLevel;
}

/** `live,test`, `live`, `test` or `none`. */
export function parseEnvironments(value: string, source: string): ("live" | "test")[] {
  const text = value.trim().toLowerCase();
  if (text === "none") return [];
  const items = text.split(",").map((item) => item.trim());
  if (items.some((item) => item !== "live" && item !== "test") || new Set(items).size !== items.length) {
    throw new UsageError(`${source} must be live,test, live, test or none, not "${value}"`);
  }
  return items as ("live" | "test")[];
}
