import type { Database } from "bun:sqlite";

/** When the product has no policy to say how long its certificates live. */
export const FALLBACK_RETENTION_SEC = 30 * 86_400;

/** Unexpired offline packages a retired key signed that outlive its place in the bundle. */
export interface InvalidatedPackages {
  count: number;
  /** Unix seconds: the latest expiry among them; null when there are none. */
  latest_expires_at: number | null;
}

/**
 * How long a retiring key must stay in the bundle so that nothing it signed stops verifying
 * early: an online certificate lives at most `cert_ttl_sec` of its policy, but an offline package
 * (and the certificate inside it) lives until its own `expires_at`, which defaults to the
 * license's expiry and can be a year or more away. Run inside the rotation's write transaction,
 * so no package issued before the rotation committed is missed.
 */
export function defaultRetentionSec(
  sqlite: Database,
  productId: string,
  keyId: string,
  nowSec: number,
): number {
  const longestCertificate =
    sqlite
      .query<{ ttl: number | null }, [string]>(
        "SELECT max(cert_ttl_sec) AS ttl FROM policies WHERE product_id = ?",
      )
      .get(productId)?.ttl ?? FALLBACK_RETENTION_SEC;
  const latest = packagesOutliving(sqlite, keyId, nowSec).latest_expires_at;
  return Math.max(longestCertificate, latest === null ? 0 : latest - nowSec);
}

/**
 * The unexpired offline packages signed by `keyId` that expire after `untilSec`: once the key
 * drops out of the bundle, a device holding a newer bundle refuses them (KEY_UNKNOWN).
 */
export function packagesOutliving(sqlite: Database, keyId: string, untilSec: number): InvalidatedPackages {
  // expires_at is stored in milliseconds; the package says whole seconds (rounded down), and a
  // device takes it as valid while now < that second.
  const row = sqlite
    .query<{ count: number; latest: number | null }, [string, number]>(
      "SELECT count(*) AS count, max(expires_at) AS latest FROM offline_packages WHERE signing_key_id = ? AND expires_at >= ?",
    )
    .get(keyId, (untilSec + 1) * 1000);
  return {
    count: row?.count ?? 0,
    latest_expires_at: row?.latest == null ? null : Math.floor(row.latest / 1000),
  };
}
