import type { Database } from "bun:sqlite";

/** When the product has no policy to say how long its certificates live. */
export const FALLBACK_RETENTION_SEC = 30 * 86_400;

/**
 * How long a retiring key stays in the bundle by default: the longest certificate the product's
 * policies can sign. Run inside the rotation's write transaction.
 */
export function defaultRetentionSec(sqlite: Database, productId: string): number {
  return (
    sqlite
      .query<{ ttl: number | null }, [string]>(
        "SELECT max(cert_ttl_sec) AS ttl FROM policies WHERE product_id = ?",
      )
      .get(productId)?.ttl ?? FALLBACK_RETENTION_SEC
  );
}
