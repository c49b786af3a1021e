import { and, eq } from "drizzle-orm";
import type { Environment } from "../../domain/scopes.ts";
import type { Db } from "../../store/db.ts";
import { billingOfferings, policies } from "../../store/schema/index.ts";
import type { LicenseRow } from "../licenses/service.ts";
import type { OfferingRow } from "./service.ts";

/**
 * Why a subscription's or invoice's prices cannot keep its license going: `unknown_price` (no
 * offering, or only a removed one for another policy), `other_product_price` (only another
 * product's offerings), `ambiguous_price` (offerings of several other policies of the product),
 * `policy_retired`, `license_type_changed` or `policy_incompatible` (the new offering's policy
 * cannot take the license).
 */
export type PriceRefusal =
  | "unknown_price"
  | "other_product_price"
  | "ambiguous_price"
  | "policy_retired"
  | "license_type_changed"
  | "policy_incompatible";

/** What the prices say about the license: keep its policy, move it to another one, or refuse. */
export type PriceDecision =
  | { kind: "keep" }
  | { kind: "switch"; offering: OfferingRow }
  | { kind: "refused"; reason: PriceRefusal };

export const KEEP: PriceDecision = { kind: "keep" };

type LicenseTerms = Pick<LicenseRow, "productId" | "policyId" | "licenseType">;

/**
 * Reads the prices a subscription now has (or an invoice charges) against the offerings, price by
 * price. A price with any offering, active or removed, of the license's own product and policy
 * keeps the license where it is: removing an offering stops new sales, not renewals, so a price
 * re-pointed at another policy (its offering removed, a new one added) still renews the licenses
 * sold before, and a subscription that also has a price of another of the product's policies (an
 * add-on) keeps the license on its own. Only when no price is the license's own do the others move
 * it: through the active offerings of its product, which must all name one policy. No price read
 * at all (an event shape without one) keeps the license as it is. Before the checkout has made the
 * license, any offering will do: the checkout's own price decides the license.
 */
export function decidePrices(
  db: Db,
  environment: Environment,
  priceIds: string[],
  license: LicenseTerms | undefined,
): PriceDecision {
  if (priceIds.length === 0) return KEEP;
  const byPrice = [...new Set(priceIds)].map((price) => offeringsOfPrice(db, environment, price));
  if (!license) return byPrice.some((offerings) => offerings.length > 0) ? KEEP : refused("unknown_price");
  const ownPolicy = (offering: OfferingRow) =>
    offering.productId === license.productId && offering.policyId === license.policyId;
  if (byPrice.some((offerings) => offerings.some(ownPolicy))) return KEEP;
  const active = byPrice.flat().filter((offering) => offering.status === "active");
  const moves = active.filter((offering) => offering.productId === license.productId);
  const targets = new Set(moves.map((offering) => offering.policyId));
  if (targets.size > 1) return refused("ambiguous_price");
  const [offering] = moves;
  if (!offering) return refused(active.length > 0 ? "other_product_price" : "unknown_price");
  const refusal = switchRefusal(db, offering, license);
  return refusal ? refused(refusal) : { kind: "switch", offering };
}

const refused = (reason: PriceRefusal): PriceDecision => ({ kind: "refused", reason });

/**
 * A license moves only to a policy that could sell it now, and stays the kind of license it is:
 * a subscription's license does not become a perpetual one (or a trial) through a price change.
 * Nor does it change how its devices are counted and checked (identity, validation, concurrency
 * unit): its activations and leases were made under the old model and would not fit the new one.
 */
function switchRefusal(db: Db, offering: OfferingRow, license: LicenseTerms): PriceRefusal | undefined {
  const policy = policyRow(db, offering.policyId);
  if (!policy || policy.status === "retired") return "policy_retired";
  if (policy.licenseType !== license.licenseType) return "license_type_changed";
  const current = policyRow(db, license.policyId);
  const incompatible =
    current !== undefined &&
    (policy.identityMode !== current.identityMode ||
      policy.validationMode !== current.validationMode ||
      policy.concurrencyUnit !== current.concurrencyUnit);
  return incompatible ? "policy_incompatible" : undefined;
}

const policyRow = (db: Db, policyId: string) =>
  db.select().from(policies).where(eq(policies.id, policyId)).get();

function offeringsOfPrice(db: Db, environment: Environment, priceId: string): OfferingRow[] {
  return db
    .select()
    .from(billingOfferings)
    .where(and(eq(billingOfferings.environment, environment), eq(billingOfferings.priceId, priceId)))
    .all();
}
