import { and, eq, inArray } from "drizzle-orm";
import { canonicalize } from "../../crypto/jcs.ts";
import { claimsOfOwnJws } from "../../crypto/jws.ts";
import { storedPackageLicenseJwt } from "../../crypto/offline-package.ts";
import type { PlanDefinition } from "../../domain/plans.ts";
import { ApiError } from "../../http/errors.ts";
import type { Db } from "../../store/db.ts";
import { activations, offlinePackages } from "../../store/schema/index.ts";
import { licenseClaim } from "../activations/certificate.ts";
import type { PolicyWithId } from "../activations/gate.ts";
import type { LicenseRow } from "../licenses/service.ts";
import type { TrustService } from "../trust/service.ts";
import type { VerifiedRequest } from "./request.ts";

/**
 * Offline issue's replays (spec §4.3): the same signed request answered again with the package
 * stored for it, for as long as that package is still what the request would get now.
 */

export type OfflinePackageRow = typeof offlinePackages.$inferSelect;

export interface IssuedPackage {
  id: string;
  bytes: Uint8Array;
  /** True when an identical request was answered with the package issued before. */
  replayed: boolean;
}

/** What a request is answered against: the rows as read under issue's write lock. */
export interface CurrentTerms {
  license: LicenseRow;
  policy: PolicyWithId;
  plan: PlanDefinition;
  asked: Date | undefined;
  now: Date;
}

/** The latest a package may end: the license's expiry, or the plan's longest license from now. */
export const packageCap = (license: LicenseRow, now: Date, plan: PlanDefinition): Date => {
  const longest = new Date(now.getTime() + plan.license_duration_max_sec * 1000);
  return license.expiresAt && license.expiresAt < longest ? license.expiresAt : longest;
};

/**
 * The license claim of a stored package's certificate, or undefined when the stored bytes are not
 * a package this server wrote (a damaged store or a hand-edited row): such bytes are never handed
 * out again, and the device's new request gets a new package.
 */
function storedLicenseClaim(row: OfflinePackageRow): unknown {
  try {
    return claimsOfOwnJws(storedPackageLicenseJwt(new Uint8Array(row.body))).license;
  } catch {
    return undefined;
  }
}

const used = (reason: string, message: string, details: Record<string, unknown> = {}) =>
  new ApiError("OFFLINE_REQUEST_USED", message, { reason, ...details });

/**
 * The package already issued for this request. Packages stored before the identity left the
 * proof out carry the former one; the two are hashes of different strings (one starts with the
 * signing prefix, the other with "{"), so neither can match the other's request.
 */
export function earlierPackage(
  db: Db,
  licenseId: string,
  request: Pick<VerifiedRequest, "identity" | "formerIdentity">,
): OfflinePackageRow | undefined {
  return db
    .select()
    .from(offlinePackages)
    .where(
      and(
        eq(offlinePackages.licenseId, licenseId),
        inArray(offlinePackages.requestSha256, [request.identity, request.formerIdentity]),
      ),
    )
    .get();
}

/**
 * An identical request gets the stored bytes while the package is still what the request would
 * get now for the same active device: not expired, its activation still active, its signing key
 * still the active one, asked with the same options, and the license's terms still the ones its
 * certificate states. Otherwise the device must make a new request.
 */
export function replayEarlier(
  db: Db,
  trust: Pick<TrustService, "committedSigningKey">,
  earlier: OfflinePackageRow,
  current: CurrentTerms,
): IssuedPackage {
  const { asked, now } = current;
  if ((asked?.getTime() ?? null) !== (earlier.requestedExpiresAt?.getTime() ?? null)) {
    throw used(
      "options_differ",
      "This request was already used with another expires_at; generate a new request.",
    );
  }
  const activation = db
    .select({ status: activations.status })
    .from(activations)
    .where(eq(activations.id, earlier.activationId))
    .get();
  const why =
    earlier.expiresAt.getTime() <= now.getTime()
      ? "package_expired"
      : activation?.status !== "active"
        ? "device_deactivated"
        : // Read, not remembered: another process may have rotated the key.
          trust.committedSigningKey(earlier.productId).keyId !== earlier.signingKeyId
          ? "signing_key_rotated"
          : licenseChanged(earlier, current);
  if (why) {
    throw used(
      why,
      "The package made from this request is no longer valid; generate a new request on the device.",
      {
        package_id: earlier.id,
      },
    );
  }
  return { id: earlier.id, bytes: new Uint8Array(earlier.body), replayed: true };
}

/**
 * Whether a new request would now get other terms than the stored package states: the package
 * ends after the license now does (its expiry was shortened, or the plan's longest license
 * was), or its certificate's license claim (expiry, type, entitlements, policy, max_concurrent)
 * is no longer the license's. Replaying it would hand out what the license no longer grants.
 * Answers the reason for a new request, or null when the stored package still holds.
 */
function licenseChanged(
  earlier: OfflinePackageRow,
  current: CurrentTerms,
): "license_changed" | "package_unreadable" | null {
  const { license, policy, plan, now } = current;
  if (earlier.expiresAt.getTime() > packageCap(license, now, plan).getTime()) return "license_changed";
  const stored = storedLicenseClaim(earlier);
  if (stored === undefined) return "package_unreadable";
  return canonicalize(stored) !== canonicalize(licenseClaim(license, policy, now)) ? "license_changed" : null;
}
