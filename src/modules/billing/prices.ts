import { and, eq } from "drizzle-orm";
import type { Environment } from "../../domain/scopes.ts";
import type { Db } from "../../store/db.ts";
import { billingOfferings, policies } from "../../store/schema/index.ts";
import type { LicenseRow } from "../licenses/service.ts";
import type { OfferingRow } from "./service.ts";

/**
 * Why a subscription's or invoice's prices cannot keep its license going: `unknown_price` (no
 * offering, or only a removed one for another policy), `other_product_price` (only another
 * product's offerings), `ambiguous_price` (offerings of several of the product's policies),
 * `policy_retired` or `license_type_changed` (the new offering's policy cannot take the license).
 */
export type PriceRefusal =
  | "unknown_price"
  | "other_product_price"
  | "ambiguous_price"
  | "policy_retired"
  | "license_type_changed";

/** What the prices say about the license: keep its policy, move it to another one, or refuse. */
export type PriceDecision =
  | { kind: "keep" }
  | { kind: "switch"; offering: OfferingRow }
  | { kind: "refused"; reason: PriceRefusal };

export const KEEP: PriceDecision = { kind: "keep" };

type LicenseTerms = Pick<LicenseRow, "productId" | "policyId" | "licenseType">;

/**
 * Reads the prices a subscription now has (or an invoice charges) against the offerings. Only
 * offerings of the license's own product count; among them one policy must stand out. A price whose
 * offering was removed still renews the licenses on its policy (removing an offering stops new
 * sales, not renewals), but no license moves to it. No price read at all (an event shape without
 * one) keeps the license as it is. Before the checkout has made the license, any offering will do:
 * the checkout's own price decides the license.
 */
export function decidePrices(
  db: Db,
  environment: Environment,
  priceIds: string[],
  license: LicenseTerms | undefined,
): PriceDecision {
  if (priceIds.length === 0) return KEEP;
  const candidates = [...new Set(priceIds)].flatMap((price) => offeringsOfPrice(db, environment, price));
  if (!license) return candidates.length > 0 ? KEEP : { kind: "refused", reason: "unknown_price" };
  const own = candidates.filter(
    (offering) =>
      offering.productId === license.productId &&
      (offering.status === "active" || offering.policyId === license.policyId),
  );
  const ownPolicies = new Set(own.map((offering) => offering.policyId));
  if (ownPolicies.size === 0) {
    const elsewhere = candidates.some(
      (offering) => offering.status === "active" && offering.productId !== license.productId,
    );
    return { kind: "refused", reason: elsewhere ? "other_product_price" : "unknown_price" };
  }
  if (ownPolicies.size > 1) return { kind: "refused", reason: "ambiguous_price" };
  const [offering] = own as [OfferingRow];
  if (offering.policyId === license.policyId) return KEEP;
  const refusal = switchRefusal(db, offering, license);
  return refusal ? { kind: "refused", reason: refusal } : { kind: "switch", offering };
}

/**
 * A license moves only to a policy that could sell it now, and stays the kind of license it is:
 * a subscription's license does not become a perpetual one (or a trial) through a price change.
 */
function switchRefusal(db: Db, offering: OfferingRow, license: LicenseTerms): PriceRefusal | undefined {
  const policy = db.select().from(policies).where(eq(policies.id, offering.policyId)).get();
  if (!policy || policy.status === "retired") return "policy_retired";
  if (policy.licenseType !== license.licenseType) return "license_type_changed";
  return undefined;
}

function offeringsOfPrice(db: Db, environment: Environment, priceId: string): OfferingRow[] {
  return db
    .select()
    .from(billingOfferings)
    .where(and(eq(billingOfferings.environment, environment), eq(billingOfferings.priceId, priceId)))
    .all();
}
