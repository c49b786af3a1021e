import type { Database } from "bun:sqlite";

/**
 * Sign-in code sends to one address (one user: an active address is unique in its environment),
 * counted by the address's HMAC whether or not it matched a user, so a start held back costs the
 * same as one that sends. Looser than trials' (spec §8: 3 per hour, 5 per day per product),
 * because a user may sign in on several devices a day; tight enough that a mailbox gets at most
 * 20 codes a day from anyone who knows a license key and the address.
 */
export const VERIFICATION_SEND_LIMITS = {
  sameAddressGapSec: 120,
  perHour: 5,
  perDay: 20,
} as const;

/**
 * Wrong codes one user may have in 24 hours across all their verifications; past it every confirm
 * for the user answers 410 as an expired verification until the oldest counted failure is a day
 * old. With at most 20 sends a day this caps guessing at 10 codes a day, not 100.
 */
export const CODE_FAILURE_BUDGET = 10;

const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;

interface Counts {
  recent: number | null;
  hour: number | null;
  day: number | null;
}

/** Prepared once; callers run both inside the immediate transaction of the start or the confirm. */
export class VerificationLimits {
  private readonly counts;
  private readonly failures;

  constructor(sqlite: Database) {
    this.counts = sqlite.prepare<Counts, [number, number, string, number]>(
      `SELECT sum(created_at > ?) AS recent, sum(created_at > ?) AS hour, count(*) AS day
       FROM email_verifications WHERE address_hash = ? AND sent = 1 AND created_at > ?`,
    );
    this.failures = sqlite.prepare<{ n: number | null }, [string, number]>(
      "SELECT sum(code_failures) AS n FROM email_verifications WHERE user_id = ? AND created_at > ?",
    );
  }

  /** Whether one more code may go to this address now. */
  allowSend(addressHash: string, now: Date): boolean {
    const t = now.getTime();
    const c = this.counts.get(
      t - VERIFICATION_SEND_LIMITS.sameAddressGapSec * 1000,
      t - HOUR_MS,
      addressHash,
      t - DAY_MS,
    );
    return (
      (c?.recent ?? 0) === 0 &&
      (c?.hour ?? 0) < VERIFICATION_SEND_LIMITS.perHour &&
      (c?.day ?? 0) < VERIFICATION_SEND_LIMITS.perDay
    );
  }

  /** Whether the user has wrong codes to spare in the last 24 hours. */
  withinFailureBudget(userId: string, now: Date): boolean {
    return (this.failures.get(userId, now.getTime() - DAY_MS)?.n ?? 0) < CODE_FAILURE_BUDGET;
  }
}
