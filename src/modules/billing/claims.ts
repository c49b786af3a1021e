import { randomBytes } from "node:crypto";
import { and, eq, gt, isNull } from "drizzle-orm";
import type { Deps } from "../../deps.ts";
import { formatLicenseKey } from "../../domain/license-key.ts";
import { ApiError } from "../../http/errors.ts";
import type { Db } from "../../store/db.ts";
import { billingClaims, licenses, products } from "../../store/schema/index.ts";
import type { LicenseRow } from "../licenses/service.ts";

/** Long enough for a buyer who reads their mail late; short enough that old links stop working. */
export const CLAIM_TTL_DAYS = 30;
const TOKEN = /^[A-Za-z0-9_-]{43}$/;
const LOOKUP_PURPOSE = "billing-claim";

export const claimUnavailable = () =>
  new ApiError("LICENSE_CLAIM_UNAVAILABLE", "This claim link is unknown, expired or already used.");

type Tx = Pick<Db, "insert" | "update" | "select">;

/**
 * Single-use claims of a bought license's key. The token is 32 random bytes, shown only in the
 * buyer's link; the store keeps its HMAC, so a copy of the database cannot redeem anything.
 */
export class ClaimService {
  constructor(private readonly deps: Pick<Deps, "db" | "clock" | "secrets">) {}

  /** Inside the checkout's transaction. Returns the token and the key for the email. */
  create(tx: Tx, license: LicenseRow): { token: string; licenseKey: string } {
    const token = randomBytes(32).toString("base64url");
    const now = this.deps.clock.now();
    tx.insert(billingClaims)
      .values({
        tokenLookup: this.deps.secrets.lookupHash(token, LOOKUP_PURPOSE),
        environment: license.environment,
        licenseId: license.id,
        createdAt: now,
        expiresAt: new Date(now.getTime() + CLAIM_TTL_DAYS * 86_400_000),
        redeemedAt: null,
      })
      .run();
    return { token, licenseKey: this.keyOf(license) };
  }

  /** Reveals the key once. Unknown, expired and used tokens are one answer, so nothing can be probed. */
  redeem(token: string) {
    if (!TOKEN.test(token)) throw claimUnavailable();
    const lookup = this.deps.secrets.lookupHash(token, LOOKUP_PURPOSE);
    return this.deps.db.transaction((tx) => {
      const now = this.deps.clock.now();
      // The update is the claim: only one redeemer can move redeemed_at from null.
      const claimed = tx
        .update(billingClaims)
        .set({ redeemedAt: now })
        .where(
          and(
            eq(billingClaims.tokenLookup, lookup),
            isNull(billingClaims.redeemedAt),
            gt(billingClaims.expiresAt, now),
          ),
        )
        .returning()
        .get();
      if (!claimed) throw claimUnavailable();
      const license = tx.select().from(licenses).where(eq(licenses.id, claimed.licenseId)).get();
      if (!license || license.status === "revoked") throw claimUnavailable();
      const product = tx.select().from(products).where(eq(products.id, license.productId)).get();
      return {
        license_id: license.id,
        product_id: license.productId,
        product_name: product?.name ?? "",
        license_key: this.keyOf(license),
        expires_at: license.expiresAt?.toISOString() ?? null,
      };
    });
  }

  private keyOf(license: LicenseRow): string {
    return formatLicenseKey(this.deps.secrets.decrypt(license.keyCiphertext, `license-key:${license.id}`));
  }
}
