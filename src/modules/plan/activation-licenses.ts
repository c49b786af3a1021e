import type { Database } from "bun:sqlite";

/** Beyond this many remembered activations the cache starts over (about 100 bytes each). */
const CACHE_LIMIT = 200_000;

/**
 * Which license an activation belongs to, for the per-license runtime windows. An activation never
 * moves to another license, so the answer is cached for good after one primary-key read; unknown
 * ids are not cached, so made-up ids cannot fill the cache.
 */
export class ActivationLicenses {
  private readonly cache = new Map<string, string>();
  private readonly read;

  constructor(sqlite: Database) {
    this.read = sqlite.prepare<{ license_id: string }, [string]>(
      "SELECT license_id FROM activations WHERE id = ?",
    );
  }

  licenseOf(activationId: string): string | null {
    const cached = this.cache.get(activationId);
    if (cached !== undefined) return cached;
    const licenseId = this.read.get(activationId)?.license_id ?? null;
    if (licenseId !== null) {
      if (this.cache.size >= CACHE_LIMIT) this.cache.clear();
      this.cache.set(activationId, licenseId);
    }
    return licenseId;
  }
}
