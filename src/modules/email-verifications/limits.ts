import type { Database } from "bun:sqlite";

/**
 * Sign-in codes, limited twice, and neither limit may tell an address with a user from one without
 * (or its answers would do what the equal 202 and the equal work of a start keep from happening).
 *
 * - Per subject (product, license key, address): every start the subject's limit lets through
 *   counts, whether or not the address had a user, so a held-back start for an unknown address
 *   behaves as one for a user: it leaves the subject's open verification open, and confirming
 *   that one answers alike. The same counted starts carry the wrong-code budget. Starts with
 *   another license key are another subject: a key of a license the user is not on spends nothing
 *   of theirs (one they are on mails them, and so fills their mailbox).
 * - Per address (a mailbox): codes really mailed, across subjects and both environments (one
 *   mailbox, whichever environment's user it is), so a user assigned to several licenses, or a
 *   live and a test user of one address, still get at most these many. It decides whether a
 *   counted start mails, and nothing else: sends happen only for users, so if it decided what a
 *   start counts or replaces, a start that mailed through one license key would show in another
 *   subject of the same address (a made-up key will do) whether the address is that license's
 *   user. Only sends count, so starts for unknown addresses cannot spend a user's mailbox either.
 *
 * Looser than trials' (spec §8: 3 per hour, 5 per day per product), because a user may sign in on
 * several devices a day; tight enough that a mailbox gets at most 20 codes a day.
 */
export const VERIFICATION_SEND_LIMITS = {
  sameAddressGapSec: 120,
  perHour: 5,
  perDay: 20,
} as const;

/**
 * Wrong codes one subject may have in 24 hours across its counted verifications; past it every
 * confirm for the subject answers 410 as an expired verification until the oldest counted failure
 * is a day old. With at most 20 counted starts a day this caps guessing at 10 codes a day per
 * license key and address, not 100.
 */
export const CODE_FAILURE_BUDGET = 10;

const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;

interface Counts {
  recent: number | null;
  hour: number | null;
  day: number | null;
}

const withinLimits = (c: Counts | null): boolean =>
  (c?.recent ?? 0) === 0 &&
  (c?.hour ?? 0) < VERIFICATION_SEND_LIMITS.perHour &&
  (c?.day ?? 0) < VERIFICATION_SEND_LIMITS.perDay;

/** Prepared once; callers run them inside the immediate transaction of the start or the confirm. */
export class VerificationLimits {
  private readonly subjectCounts;
  private readonly mailboxCounts;
  private readonly failures;

  constructor(sqlite: Database) {
    this.subjectCounts = sqlite.prepare<Counts, [number, number, string, number]>(
      `SELECT sum(created_at > ?) AS recent, sum(created_at > ?) AS hour, count(*) AS day
       FROM email_verifications WHERE subject_hash = ? AND counted = 1 AND created_at > ?`,
    );
    this.mailboxCounts = sqlite.prepare<Counts, [number, number, string, number]>(
      `SELECT sum(created_at > ?) AS recent, sum(created_at > ?) AS hour, count(*) AS day
       FROM email_verifications WHERE address_hash = ? AND sent = 1 AND created_at > ?`,
    );
    this.failures = sqlite.prepare<{ n: number | null }, [string, number]>(
      "SELECT sum(code_failures) AS n FROM email_verifications WHERE subject_hash = ? AND counted = 1 AND created_at > ?",
    );
  }

  /**
   * Whether this start counts (it replaces the subject's open verification and may mail), and
   * whether the mailbox takes another code (a counted start for a user mails only then). Both
   * limits are always asked, so every start runs the same statements.
   */
  check(subjectHash: string, addressHash: string, now: Date): { counted: boolean; mailboxOpen: boolean } {
    const t = now.getTime();
    const args = (key: string) =>
      [t - VERIFICATION_SEND_LIMITS.sameAddressGapSec * 1000, t - HOUR_MS, key, t - DAY_MS] as const;
    const counted = withinLimits(this.subjectCounts.get(...args(subjectHash)));
    const mailboxOpen = withinLimits(this.mailboxCounts.get(...args(addressHash)));
    return { counted, mailboxOpen };
  }

  /** Whether the subject has wrong codes to spare in the last 24 hours. */
  withinFailureBudget(subjectHash: string, now: Date): boolean {
    return (this.failures.get(subjectHash, now.getTime() - DAY_MS)?.n ?? 0) < CODE_FAILURE_BUDGET;
  }
}
