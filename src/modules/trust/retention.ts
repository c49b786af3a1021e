import type { Database } from "bun:sqlite";

/** When the product has no policy to say how long its certificates stay usable. */
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
  /**
   * Unix seconds: until when a certificate the key signed up to now may stay usable (now + the
   * longest certificate of the product's policies, grace included: certificateUsableSec). The
   * least the key stays by default; null when the product has no policy (it signed none).
   */
  certificatesUsableUntil: number | null;
}

/**
 * The longest an online certificate of the product's policies stays usable on a device, in
 * seconds: `cert_ttl_sec`, plus `network_grace_sec` for a policy that fails open. That is the
 * SDK's rule (protocol §10, sdk.md "Offline behaviour"): a certificate is valid while
 * `now < exp` and, with `heartbeat.grace_sec` > 0, in grace while `now < exp + grace_sec`; the
 * server writes `grace_sec` = `network_grace_sec` when `fail_mode` is `open`, else 0
 * (activations/certificate.ts), and `exp` ≤ `iat + cert_ttl_sec`. A device treats a certificate
 * whose signer is retired as invalid from the key's `not_after` on, whatever its grace, so the key
 * must stay listed that long or a fail-open device loses its grace during an outage. Every policy
 * of the product counts, retired ones too: their licenses' devices still hold certificates.
 * (An offline package's certificate has no grace; its own `expires_at` is packagesOutliving's.)
 */
export function certificateUsableSec(sqlite: Database, productId: string): number | null {
  return (
    sqlite
      .query<{ usable: number | null }, [string]>(
        `SELECT max(cert_ttl_sec + CASE WHEN fail_mode = 'open' THEN network_grace_sec ELSE 0 END) AS usable
           FROM policies WHERE product_id = ?`,
      )
      .get(productId)?.usable ?? null
  );
}

/**
 * How long a retiring key must stay in the bundle so that nothing it signed stops verifying
 * early: an online certificate stays usable at most `cert_ttl_sec` of its policy plus, when the
 * policy fails open, its network grace (certificateUsableSec); but an offline package (and the
 * certificate inside it) lives until its own `expires_at`, which defaults to the license's expiry
 * and can be a year or more away (about a century for a perpetual license). Run inside the
 * rotation's write transaction, so no package issued before the rotation committed is missed.
 * Packages of revoked licenses do not count (see packagesOutliving).
 */
export function defaultRetention(
  sqlite: Database,
  productId: string,
  keyId: string,
  nowSec: number,
): DefaultRetention {
  const usable = certificateUsableSec(sqlite, productId);
  const packages = packagesOutliving(sqlite, keyId, nowSec);
  const latest = packages.latest_expires_at;
  return {
    retainSec: Math.max(usable ?? FALLBACK_RETENTION_SEC, latest === null ? 0 : latest - nowSec),
    packages,
    certificatesUsableUntil: usable === null ? null : nowSec + usable,
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
