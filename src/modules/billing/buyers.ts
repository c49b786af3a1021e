import { Value } from "@sinclair/typebox/value";
import { and, eq } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { parseEmailAddress } from "../../domain/email-address.ts";
import { CONTROL_CHARACTERS, NameField } from "../../http/schemas.ts";
import { customers } from "../../store/schema/index.ts";
import type { CustomerService } from "../customers/service.ts";
import { checkoutBuyer, type Json } from "./stripe.ts";

/** The API's rule for names, which a buyer's name is made to follow before it is stored. */
const NAME = NameField();
const NAME_MAX = NAME.maxLength as number;
/**
 * Terminal control sequences, in their 7-bit (ESC [, ESC ]) and 8-bit (CSI, OSC) forms: CSI up to
 * its final byte, OSC (such as an OSC 8 hyperlink) up to its terminator. Removed whole, so that no
 * parameter text of one is left in the name.
 */
const ESCAPE_SEQUENCE = new RegExp(
  [
    "(?:\\u001b\\[|\\u009b)[\\u0030-\\u003f]*[\\u0020-\\u002f]*[\\u0040-\\u007e]",
    "(?:\\u001b\\]|\\u009d)[^\\u0007\\u001b\\u009c]*(?:\\u0007|\\u001b\\\\|\\u009c)?",
  ].join("|"),
  "g",
);
const CONTROL_RUN = new RegExp(`[${CONTROL_CHARACTERS}]+`, "g");

export interface Buyer {
  email?: string;
  name?: string;
  providerCustomerId?: string;
}

/**
 * The buyer as a customer may store them. Stripe takes whatever the buyer typed, but a paid
 * purchase must not fail over it: the name is made to follow the API's name rule (escape
 * sequences dropped, other control characters and line breaks made single spaces, cut to 200
 * characters), or dropped when nothing is left; an address that is not a plain addr-spec is
 * dropped rather than stored, and mailed, as one.
 */
export function readBuyer(session: Json): Buyer {
  const raw = checkoutBuyer(session);
  const email = raw.email === undefined ? undefined : parseEmailAddress(raw.email)?.address;
  const name = raw.name === undefined ? undefined : buyerName(raw.name);
  return {
    ...(email ? { email } : {}),
    ...(name ? { name } : {}),
    ...(raw.providerCustomerId ? { providerCustomerId: raw.providerCustomerId } : {}),
  };
}

export function buyerName(raw: string): string | undefined {
  // A lone surrogate (the webhook's body may hold one) becomes U+FFFD, which UTF-8 can carry.
  const oneLine = raw
    .toWellFormed()
    .replace(ESCAPE_SEQUENCE, "")
    .replace(CONTROL_RUN, " ")
    .replace(/\s+/g, " ")
    .trim();
  let name = oneLine.slice(0, NAME_MAX);
  // Cutting between the halves of a surrogate pair would leave half a character.
  if (/[\ud800-\udbff]$/.test(name)) name = name.slice(0, -1);
  name = name.trimEnd();
  return Value.Check(NAME, name) ? name : undefined;
}

/**
 * The buyer's customer: the active one with their Stripe customer id as `external_ref`, else the
 * active one with their address, else a new one (when there is a name or an address to give it).
 * An archived customer is never linked; the new customer made instead takes the Stripe id, so the
 * buyer's next purchase finds it rather than making another.
 */
export function customerForBuyer(
  deps: Pick<Deps, "db">,
  service: CustomerService,
  buyer: Buyer,
  ctx: ChangeContext,
): string | null {
  const ref = buyer.providerCustomerId;
  const byRef = ref ? customerWithRef(deps.db, ref).get() : undefined;
  if (byRef) return byRef.id;
  const byEmail = buyer.email ? service.findActiveByEmail(buyer.email) : undefined;
  if (byEmail) return byEmail.id;
  if (!buyer.name && !buyer.email) return null;
  return service.create({ name: buyer.name, email: buyer.email, ...(ref ? { external_ref: ref } : {}) }, ctx)
    .id;
}

/** The active customer with this `external_ref` (migration 0041 indexes it). */
export const customerWithRef = (db: Deps["db"], ref: string) =>
  db
    .select()
    .from(customers)
    .where(and(eq(customers.externalRef, ref), eq(customers.status, "active")));
