import { createHmac, timingSafeEqual } from "node:crypto";
import { wellFormedText } from "../../http/body.ts";

/** Stripe's own tolerance: a signed delivery older (or newer) than this is refused as a replay. */
export const SIGNATURE_TOLERANCE_SEC = 300;
/** Far beyond Stripe's one timestamp and few signatures; bounds the work an attacker can cause. */
const MAX_HEADER_LENGTH = 4096;
const MAX_SIGNATURES = 8;
const HEX_SHA256 = /^[0-9a-f]{64}$/;

export type SignatureFailure = "missing" | "malformed" | "expired" | "mismatch";

export interface ParsedSignatureHeader {
  timestamp: number;
  signatures: Buffer[];
}

/**
 * `Stripe-Signature: t=<unix seconds>,v1=<hex>,v1=<hex>,v0=<ignored>`. Several v1 values appear
 * while the endpoint's secret is being rolled; any one may match. Other schemes are ignored, as
 * Stripe's libraries do (v0 is its insecure test scheme).
 */
export function parseSignatureHeader(header: string | null): ParsedSignatureHeader | SignatureFailure {
  if (header === null || header.trim() === "") return "missing";
  if (header.length > MAX_HEADER_LENGTH) return "malformed";
  let timestamp: number | undefined;
  const signatures: Buffer[] = [];
  for (const part of header.split(",")) {
    const eq = part.indexOf("=");
    if (eq === -1) return "malformed";
    const key = part.slice(0, eq).trim();
    const value = part.slice(eq + 1).trim();
    if (key === "t") {
      if (timestamp !== undefined || !/^\d{1,12}$/.test(value)) return "malformed";
      timestamp = Number(value);
    } else if (key === "v1") {
      if (!HEX_SHA256.test(value) || signatures.length >= MAX_SIGNATURES) return "malformed";
      signatures.push(Buffer.from(value, "hex"));
    }
  }
  if (timestamp === undefined || signatures.length === 0) return "malformed";
  return { timestamp, signatures };
}

/** HMAC-SHA256 over `<t>.<raw body>` keyed with the whole `whsec_…` string, as Stripe signs. */
export function expectedSignature(secret: string, timestamp: number, rawBody: Uint8Array): Buffer {
  return createHmac("sha256", secret).update(`${timestamp}.`).update(rawBody).digest();
}

/** Every candidate is compared in constant time, and all of them are, so timing tells nothing. */
export function signatureMatches(
  secret: string,
  parsed: ParsedSignatureHeader,
  rawBody: Uint8Array,
): boolean {
  const expected = expectedSignature(secret, parsed.timestamp, rawBody);
  let match = false;
  for (const candidate of parsed.signatures) {
    if (candidate.length === expected.length && timingSafeEqual(candidate, expected)) match = true;
  }
  return match;
}

export const withinTolerance = (timestamp: number, nowSec: number): boolean =>
  Math.abs(nowSec - timestamp) <= SIGNATURE_TOLERANCE_SEC;

// ---- Reading events -------------------------------------------------------------------------
// Events are read defensively: only the fields used are picked, each checked for its type, so an
// API version that moved a field degrades to "not found" rather than a crash.

export type Json = Record<string, unknown>;

export const isObject = (value: unknown): value is Json =>
  typeof value === "object" && value !== null && !Array.isArray(value);

/**
 * A non-empty string field. The webhook's body may hold any text (http/body.ts, the `provider`
 * rule), so one with a lone surrogate or a NUL reads as not found: no such id, type or address is
 * Stripe's, and none may reach the store. The buyer's name is read with `text` and cleaned.
 */
export const str = (value: unknown): string | undefined =>
  typeof value === "string" && value !== "" && wellFormedText(value) ? value : undefined;

/** Any non-empty string, for a field that is cleaned before use (the buyer's name: billing/buyers.ts). */
const text = (value: unknown): string | undefined =>
  typeof value === "string" && value !== "" ? value : undefined;

/**
 * The latest Unix time read from an event: the end of 9999-12-30, so that a period end plus the
 * renewal grace is still a date with a four-digit year. Stripe's times are decades from it; a
 * later one (or one past JavaScript's dates, which became an Invalid Date and was stored as no
 * expiry at all) is not a time.
 */
const LATEST_TIME_SEC = 253_402_214_399;

/** A Unix time in seconds, or undefined. Every number this module reads is one. */
const unixTime = (value: unknown): number | undefined =>
  typeof value === "number" && Number.isSafeInteger(value) && value >= 0 && value <= LATEST_TIME_SEC
    ? value
    : undefined;

/** An id field that is either the id itself or the expanded object. */
export const idOf = (value: unknown): string | undefined =>
  str(value) ?? (isObject(value) ? str(value.id) : undefined);

const list = (value: unknown): Json[] =>
  isObject(value) && Array.isArray(value.data) ? value.data.filter(isObject) : [];

export interface ProviderEvent {
  id: string;
  type: string;
  livemode: boolean;
  /** When the provider created the event (Unix seconds): the only order its events have. */
  created: number | undefined;
  object: Json;
}

/** The longest id or type a provider's event may carry; longer is no provider's. */
export const MAX_PROVIDER_ID_LENGTH = 255;

export function readEvent(body: unknown): ProviderEvent | undefined {
  if (!isObject(body)) return undefined;
  const id = str(body.id);
  const type = str(body.type);
  const object = isObject(body.data) ? body.data.object : undefined;
  if (!id || !type || typeof body.livemode !== "boolean" || !isObject(object)) return undefined;
  if (id.length > MAX_PROVIDER_ID_LENGTH || type.length > MAX_PROVIDER_ID_LENGTH) return undefined;
  return { id, type, livemode: body.livemode, created: unixTime(body.created), object };
}

/** The price of a line item, in the shapes of both older and newer (2025-03+) API versions. */
export function linePriceId(line: Json): string | undefined {
  const pricing = isObject(line.pricing) ? line.pricing : undefined;
  const details = pricing && isObject(pricing.price_details) ? pricing.price_details : undefined;
  return idOf(line.price) ?? idOf(details?.price) ?? (isObject(line.plan) ? str(line.plan.id) : undefined);
}

/** Price ids a checkout session carries itself: expanded line items, else our documented metadata. */
export function checkoutPriceIds(session: Json): string[] {
  const fromLines = list(session.line_items)
    .map(linePriceId)
    .filter((id): id is string => id !== undefined);
  if (fromLines.length > 0) return fromLines;
  const metadata = isObject(session.metadata) ? session.metadata : {};
  const fromMetadata = str(metadata.licensing_price_id);
  return fromMetadata ? [fromMetadata] : [];
}

export function checkoutBuyer(session: Json): { email?: string; name?: string; providerCustomerId?: string } {
  const details = isObject(session.customer_details) ? session.customer_details : {};
  return {
    email: str(details.email) ?? str(session.customer_email),
    name: text(details.name),
    providerCustomerId: idOf(session.customer),
  };
}

/** The subscription an invoice pays, in both older (`subscription`) and newer (`parent`) shapes. */
export function invoiceSubscriptionId(invoice: Json): string | undefined {
  const parent = isObject(invoice.parent) ? invoice.parent : undefined;
  const details = parent && isObject(parent.subscription_details) ? parent.subscription_details : undefined;
  return idOf(invoice.subscription) ?? idOf(details?.subscription);
}

/** The end of the period an invoice pays for: the latest line period end (Unix seconds). */
export function invoicePeriodEnd(invoice: Json): number | undefined {
  const ends = list(invoice.lines)
    .map((line) => (isObject(line.period) ? unixTime(line.period.end) : undefined))
    .filter((end): end is number => end !== undefined);
  return ends.length > 0 ? Math.max(...ends) : undefined;
}

/**
 * Whether a line is a proration: the credit for the old price and the charge for the new one when
 * a subscription changes price mid-period, flagged on the line (older API versions) or on its
 * `parent` details (2025-03+).
 */
function isProration(line: Json): boolean {
  if (line.proration === true) return true;
  const parent = isObject(line.parent) ? line.parent : undefined;
  if (!parent) return false;
  return [parent.subscription_item_details, parent.invoice_item_details].some(
    (details) => isObject(details) && details.proration === true,
  );
}

/**
 * The prices an invoice charges for its period. Proration lines are left out: a price change
 * mid-period bills both the old and the new price, and the subscription's own event says which
 * one it now has.
 */
export function invoicePriceIds(invoice: Json): string[] {
  return list(invoice.lines)
    .filter((line) => !isProration(line))
    .map(linePriceId)
    .filter((id): id is string => id !== undefined);
}

/** Current period end of a subscription: on the object (older API) or on its items (2025-03+). */
export function subscriptionPeriodEnd(subscription: Json): number | undefined {
  const own = unixTime(subscription.current_period_end);
  if (own !== undefined) return own;
  const ends = list(subscription.items)
    .map((item) => unixTime(item.current_period_end))
    .filter((end): end is number => end !== undefined);
  return ends.length > 0 ? Math.max(...ends) : undefined;
}

const ENDED_STATUSES = new Set(["canceled", "incomplete_expired", "unpaid"]);
/**
 * Statuses Stripe never leaves: a canceled subscription can change only its cancellation details,
 * and an expired incomplete one nothing. (`unpaid` ends access but is left when paid.)
 */
const TERMINAL_STATUSES = new Set(["canceled", "incomplete_expired"]);

export const subscriptionTerminal = (subscription: Json): boolean =>
  TERMINAL_STATUSES.has(str(subscription.status) ?? "");

/**
 * When a subscription stops granting the license, in Unix seconds: `ended_at` (or now) once it has
 * ended, the scheduled `cancel_at` or period end when it is set to cancel, undefined while it runs.
 */
export function subscriptionEnd(subscription: Json, nowSec: number): number | undefined {
  const status = str(subscription.status);
  if (status && ENDED_STATUSES.has(status)) return unixTime(subscription.ended_at) ?? nowSec;
  const cancelAt = unixTime(subscription.cancel_at);
  if (cancelAt !== undefined) return cancelAt;
  if (subscription.cancel_at_period_end === true) return subscriptionPeriodEnd(subscription);
  return undefined;
}

export function subscriptionPriceIds(subscription: Json): string[] {
  return list(subscription.items)
    .map(linePriceId)
    .filter((id): id is string => id !== undefined);
}
