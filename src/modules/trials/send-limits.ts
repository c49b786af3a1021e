import type { Database } from "bun:sqlite";

/** Spec §8 "Trial code sends", per address (compared by its HMAC). */
export const SEND_LIMITS = {
  sameAddressGapSec: 120,
  perProductPerHour: 3,
  perProductPerDay: 5,
  perDayAcrossProducts: 10,
} as const;

const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;

interface Counts {
  recent: number | null;
  product_hour: number | null;
  product_day: number | null;
  day: number | null;
}

/**
 * Counts the codes actually sent to an address. Callers run it inside the immediate transaction
 * that records the new send, so parallel starts are serialised and none slips past a limit.
 */
export class SendLimits {
  private readonly counts;

  constructor(sqlite: Database) {
    this.counts = sqlite.prepare<Counts, [number, string, number, string, string, number]>(
      `SELECT sum(created_at > ?) AS recent,
              sum(product_id = ? AND created_at > ?) AS product_hour,
              sum(product_id = ?) AS product_day,
              count(*) AS day
       FROM trial_verifications WHERE email_lookup = ? AND sent = 1 AND created_at > ?`,
    );
  }

  /** Whether one more code may go to this address for this product now. */
  allow(emailLookup: string, productId: string, now: Date): boolean {
    const t = now.getTime();
    const c = this.counts.get(
      t - SEND_LIMITS.sameAddressGapSec * 1000,
      productId,
      t - HOUR_MS,
      productId,
      emailLookup,
      t - DAY_MS,
    );
    return (
      (c?.recent ?? 0) === 0 &&
      (c?.product_hour ?? 0) < SEND_LIMITS.perProductPerHour &&
      (c?.product_day ?? 0) < SEND_LIMITS.perProductPerDay &&
      (c?.day ?? 0) < SEND_LIMITS.perDayAcrossProducts
    );
  }
}
