import type { Database } from "bun:sqlite";

/** When the product has no policy to say how long its certificates live. */
export const FALLBACK_RETENTION_SEC = 30 * 86_400;

/** Unexpired offline packages a retired key signed that outlive its place in the bundle. */
export interface InvalidatedPackages {
  count: number;
  /** Unix seconds: the latest expiry among them; null when there are none. */
  latest_expires_at: number | null;
}

/** How long a retiring key stays listed, and what set that. */
export interface DefaultRetention {
  retainSec: number;
  /** The packages that keep the key listed (all of them expire by `now + retainSec`). */
  packages: InvalidatedPackages;
  /** The longest certificate lifetime of the product's policies: the least the key stays. */
  certificateSec: number;
}

/**
 * How long a retiring key must stay in the bundle so that nothing it signed stops verifying
 * early: an online certificate lives at most `cert_ttl_sec` of its policy, but an offline package
 * (and the certificate inside it) lives until its own `expires_at`, which defaults to the
 * license's expiry and can be a year or more away (about a century for a perpetual license). Run
 * inside the rotation's write transaction, so no package issued before the rotation committed is
 * missed. Packages of revoked licenses do not count (see packagesOutliving).
 */
export function defaultRetention(
  sqlite: Database,
  productId: string,
  keyId: string,
  nowSec: number,
): DefaultRetention {
  const certificateSec =
    sqlite
      .query<{ ttl: number | null }, [string]>(
        "SELECT max(cert_ttl_sec) AS ttl FROM policies WHERE product_id = ?",
      )
      .get(productId)?.ttl ?? FALLBACK_RETENTION_SEC;
  const packages = packagesOutliving(sqlite, keyId, nowSec);
  const latest = packages.latest_expires_at;
  return {
    retainSec: Math.max(certificateSec, latest === null ? 0 : latest - nowSec),
    packages,
    certificateSec,
  };
}

/**
 * The unexpired offline packages signed by `keyId` that expire after `untilSec`: once the key
 * drops out of the bundle, a device holding a newer bundle refuses them (KEY_UNKNOWN).
 *
 * A package of a revoked license is left out: revocation is final, the package should stop
 * working wherever it can, and dropping its key from the bundle is the one way the service has to
 * reach an offline device (one that later receives a newer bundle, e.g. with an app update).
 * Counting it let a single perpetual license's package (valid ~100 years) pin a retired key for a
 * century. A suspended license's package still counts: a suspension can be lifted, and the package
 * must then work again.
 */
export function packagesOutliving(sqlite: Database, keyId: string, untilSec: number): InvalidatedPackages {
  // expires_at is stored in milliseconds; the package says whole seconds (rounded down), and a
  // device takes it as valid while now < that second.
  const row = sqlite
    .query<{ count: number; latest: number | null }, [string, number]>(
      `SELECT count(*) AS count, max(p.expires_at) AS latest
         FROM offline_packages p JOIN licenses l ON l.id = p.license_id
        WHERE p.signing_key_id = ? AND p.expires_at >= ? AND l.status <> 'revoked'`,
    )
    .get(keyId, (untilSec + 1) * 1000);
  return {
    count: row?.count ?? 0,
    latest_expires_at: row?.latest == null ? null : Math.floor(row.latest / 1000),
  };
}
