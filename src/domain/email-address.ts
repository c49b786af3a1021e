/**
 * The one email address validator (trial start and confirm, email verification start, license
 * users, customers, resellers). A conservative addr-spec and nothing else: a display name, group,
 * list, comment, quoted string or domain literal is refused, so no mail library can read a second
 * or different mailbox out of what a caller typed (`x<victim@example.com>` was one address to the
 * send limits and another to the mailer).
 *
 * - local part: RFC 5322 atext atoms joined by single dots, ASCII only, at most 64 characters;
 * - domain: LDH labels (at most 63 characters, no leading or trailing hyphen) with at least one
 *   dot and a last label that is not all digits; an international domain is converted to
 *   punycode by the WHATWG URL parser (UTS 46), and the result must be LDH too;
 * - no whitespace or control characters anywhere (surrounding spaces are not trimmed), at most
 *   254 characters in all, the domain at most 255.
 *
 * The address that is mailed keeps the local part as typed (RFC 5321 lets a mailbox be
 * case-sensitive there) with the domain lower-cased; the lookup key, which limits, reuse windows
 * and uniqueness compare, is the NFC form lower-cased. Plus-addressing is deliberately not folded.
 */

const ATEXT = "A-Za-z0-9!#$%&'*+/=?^_`{|}~-";
const LOCAL = `[${ATEXT}]+(\\.[${ATEXT}]+)*`;
/** Non-ASCII letters are let through to the URL parser, which maps or refuses them. */
const DOMAIN_CHAR = "A-Za-z0-9\\u00a1-\\uffff";
const DOMAIN_LABEL = `[${DOMAIN_CHAR}]([${DOMAIN_CHAR}-]*[${DOMAIN_CHAR}])?`;

/** For request schemas (and so OpenAPI): a first filter; `parseEmailAddress` is the full check. */
export const EMAIL_ADDRESS_PATTERN = `^${LOCAL}@${DOMAIN_LABEL}(\\.${DOMAIN_LABEL})+$`;
export const EMAIL_ADDRESS_MAX_LENGTH = 254;

const LOCAL_RE = new RegExp(`^${LOCAL}$`);
const DOMAIN_INPUT_RE = new RegExp(`^${DOMAIN_LABEL}(\\.${DOMAIN_LABEL})+$`);
const LDH_LABEL = "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?";
const LDH_DOMAIN_RE = new RegExp(`^(${LDH_LABEL}\\.)+${LDH_LABEL}$`);
const ASCII_RE = /^[\x21-\x7e]*$/;
const ALL_DIGITS_RE = /^[0-9]+$/;
/** Longer input is refused before any Unicode work. */
const MAX_INPUT = 1024;

export interface EmailAddress {
  /** What is mailed: the local part as typed, the domain lower-cased (punycode for an IDN). */
  address: string;
  /** What is compared: NFC, lower-cased. */
  normalized: string;
}

function asciiDomain(input: string): string | null {
  if (!DOMAIN_INPUT_RE.test(input)) return null;
  let host: string;
  if (ASCII_RE.test(input)) {
    host = input.toLowerCase();
  } else {
    try {
      host = new URL(`http://${input}/`).hostname;
    } catch {
      return null;
    }
  }
  if (host.length > 255 || !LDH_DOMAIN_RE.test(host)) return null;
  // A dotted number (also one spelled in full-width digits) is an IP address, not a mail domain.
  if (ALL_DIGITS_RE.test(host.slice(host.lastIndexOf(".") + 1))) return null;
  return host;
}

/** The address and its lookup key, or null when `input` is not a plain addr-spec within the limits. */
export function parseEmailAddress(input: string): EmailAddress | null {
  if (input.length === 0 || input.length > MAX_INPUT) return null;
  const text = input.normalize("NFC");
  const at = text.lastIndexOf("@");
  if (at <= 0) return null;
  const local = text.slice(0, at);
  if (local.length > 64 || !LOCAL_RE.test(local)) return null;
  const domain = asciiDomain(text.slice(at + 1));
  if (!domain) return null;
  const address = `${local}@${domain}`;
  if (address.length > EMAIL_ADDRESS_MAX_LENGTH) return null;
  return { address, normalized: address.normalize("NFC").toLowerCase() };
}
