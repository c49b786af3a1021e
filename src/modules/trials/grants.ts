import { and, desc, eq, gt, or } from "drizzle-orm";
import { licenseStatus } from "../../domain/license-state.ts";
import type { Db } from "../../store/db.ts";
import { licenses, trialGrants } from "../../store/schema/index.ts";
import type { LicenseRow } from "../licenses/service.ts";

/** Spec §8: an address or a device key gets one sign-up trial of a product per 365 days. */
export const TRIAL_REUSE_WINDOW_MS = 365 * 86_400_000;

type Reader = Pick<Db, "select">;

/** The address's sign-up trial of this product that is still running (active, still a trial), if any. */
export function activeTrialOf(
  db: Reader,
  productId: string,
  emailLookup: string,
  now: Date,
): LicenseRow | undefined {
  const rows = db
    .select({ license: licenses })
    .from(trialGrants)
    .innerJoin(licenses, eq(licenses.id, trialGrants.licenseId))
    .where(
      and(
        eq(trialGrants.productId, productId),
        eq(trialGrants.emailLookup, emailLookup),
        eq(trialGrants.kind, "started"),
      ),
    )
    .orderBy(desc(trialGrants.createdAt))
    .all();
  return rows
    .map((row) => row.license)
    .find((license) => license.licenseType === "trial" && licenseStatus(license, now) === "active");
}

/** Whether the address or the device key was put on a sign-up trial of this product within the window. */
export function hadTrial(
  db: Reader,
  productId: string,
  emailLookup: string,
  deviceThumbprint: string,
  now: Date,
): boolean {
  const since = new Date(now.getTime() - TRIAL_REUSE_WINDOW_MS);
  return (
    db
      .select({ id: trialGrants.id })
      .from(trialGrants)
      .where(
        and(
          eq(trialGrants.productId, productId),
          gt(trialGrants.createdAt, since),
          or(eq(trialGrants.emailLookup, emailLookup), eq(trialGrants.deviceThumbprint, deviceThumbprint)),
        ),
      )
      .limit(1)
      .get() !== undefined
  );
}
