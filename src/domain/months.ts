/**
 * Calendar months in UTC, the months of plan allowances, usage reports and the lease month counts.
 * Only month starts (the 1st, 00:00:00.000 UTC) are computed, so no month end is ever clamped.
 */

/** The first instant of the month `offset` months from the one `date` is in (UTC). */
export const monthStart = (date: Date, offset = 0): Date =>
  new Date(Date.UTC(date.getUTCFullYear(), date.getUTCMonth() + offset, 1));

/** The first instant of the next calendar month (UTC): when a monthly allowance resets. */
export const nextMonthStart = (date: Date): Date => monthStart(date, 1);

/** The month `date` is in, as `YYYY-MM` (UTC). */
export const monthLabel = (date: Date): string => date.toISOString().slice(0, 7);
