import type { Environment } from "../../domain/scopes.ts";

/** Spec §8: `allowed_origins` holds at most 20 entries. */
export const MAX_ALLOWED_ORIGINS = 20;

export type OriginCheck = { origin: string } | { error: string };

const SCHEME = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//;
// Whitespace and controls: URL parsing silently strips some of them, so what was stored would not
// be what was sent.
const INVISIBLE = /[\s\p{Cc}]/u;

/**
 * Checks one entry of `allowed_origins` (spec §4.3 rule 2) and returns its canonical form, the
 * exact string a browser sends in `Origin`: scheme and host lower-cased, an internationalised host
 * in punycode, the default port (443, or 80 for http) left out. Refused: `null`, wildcards,
 * userinfo, any path (even a lone `/`), query or fragment, percent-encoding, a host that is not an
 * IP address or a DNS name of letters, digits and hyphens (or ends with a dot), schemes other than
 * https, and http except for loopback hosts of test products.
 */
export function canonicalOrigin(raw: string, environment: Environment): OriginCheck {
  if (raw.trim().toLowerCase() === "null") return { error: "null is not an allowed origin" };
  if (INVISIBLE.test(raw)) return { error: "must not contain spaces or control characters" };
  if (raw.includes("*")) return { error: "wildcards are not allowed; list each origin exactly" };
  const scheme = SCHEME.exec(raw);
  if (!scheme?.[1]) return { error: "must be an origin such as https://app.example.com" };
  const protocol = scheme[1].toLowerCase();
  const rest = raw.slice(scheme[0].length);
  // Backslash ends the host too: URL treats it as a path separator for http(s).
  const cut = rest.search(/[/\\?#]/);
  const authority = cut < 0 ? rest : rest.slice(0, cut);
  const tail = cut < 0 ? "" : rest.slice(cut);
  if (authority.includes("@")) return { error: "must not contain userinfo (user:password@)" };
  if (tail.startsWith("?")) return { error: "must not have a query" };
  if (tail.startsWith("#")) return { error: "must not have a fragment" };
  if (tail !== "") return { error: "must not have a path (not even a trailing /)" };
  if (authority === "") return { error: "must name a host" };
  if (authority.includes("%")) return { error: "must not be percent-encoded" };
  if (protocol !== "https" && protocol !== "http") return { error: "must use https" };
  let url: URL;
  try {
    url = new URL(`${protocol}://${authority}`);
  } catch {
    return { error: "is not a valid origin" };
  }
  const hostProblem = originHostProblem(url.hostname);
  if (hostProblem) return { error: hostProblem };
  if (protocol === "http") {
    if (environment !== "test") {
      return { error: "must use https (http is accepted only for loopback origins of test products)" };
    }
    if (!isLoopbackHost(url.hostname)) {
      return { error: "http is accepted only for loopback hosts (localhost, 127.0.0.0/8, [::1])" };
    }
  }
  return { origin: url.origin };
}

const IPV4 = /^\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}$/;
// After URL parsing: lower case, an internationalised label already in punycode (`xn--…`). An
// underscore is not a host name's letter (RFC 952) but is a DNS name's, and browsers load such
// hosts and send them in `Origin` (a service record's name, an internal CA's certificate).
const HOST_LABEL = /^[a-z0-9_-]+$/;

/**
 * Why `hostname` (as URL serialises it) cannot be the host of an origin a browser sends, or null.
 * URL parsing keeps hosts no DNS name has (`a..com`, `-a.com`, `a$b.com`): stored, they
 * would never match a page's `Origin`, and the vendor would learn of it only when the browser
 * client is refused. IP literals are left as URL normalised them.
 */
function originHostProblem(hostname: string): string | null {
  if (hostname.startsWith("[") || IPV4.test(hostname)) return null;
  const name = hostname.endsWith(".") ? hostname.slice(0, -1) : hostname;
  if (name.length > 253) return "must have a host of at most 253 characters";
  for (const label of name.split(".")) {
    if (label === "") return "must not have an empty label in its host (two dots in a row, or a leading dot)";
    if (label.length > 63) return "must not have a host label longer than 63 characters";
    if (!HOST_LABEL.test(label))
      return "must have a host of letters, digits, hyphens and underscores only (no other signs)";
    if (label.startsWith("-") || label.endsWith("-"))
      return "must not have a host label that starts or ends with a hyphen";
  }
  if (name !== hostname)
    return "must not end its host with a dot; list the host as the site is addressed (https://app.example.com)";
  return null;
}

/** `hostname` as URL serialises it: IPv4 normalised to dotted quads, IPv6 in brackets. */
export function isLoopbackHost(hostname: string): boolean {
  return (
    hostname === "localhost" || hostname === "[::1]" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(hostname)
  );
}
