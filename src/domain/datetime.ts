// RFC 3339 §5.6: "T" and "Z" may be written in lower case.
const ISO_DATE_TIME =
  /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-](\d{2}):(\d{2}))$/;

/**
 * A strict RFC 3339 date-time: a real calendar date (no 31 February), a real time (no 24:00), and
 * an explicit offset. `new Date()` alone would roll 2030-02-31 over to 3 March, and take "2030" or
 * "Jan 1 2030" as dates.
 */
export function parseDateTime(value: string): Date | null {
  const m = ISO_DATE_TIME.exec(value);
  if (!m) return null;
  const [year, month, day, hour, minute, second] = [m[1], m[2], m[3], m[4], m[5], m[6]].map(
    Number,
  ) as number[];
  if (
    year === undefined ||
    month === undefined ||
    day === undefined ||
    hour === undefined ||
    minute === undefined ||
    second === undefined
  ) {
    return null;
  }
  if (year < 1970 || month < 1 || month > 12 || hour > 23 || minute > 59 || second > 59) return null;
  if (day < 1 || day > new Date(Date.UTC(year, month, 0)).getUTCDate()) return null;
  if (m[9] !== undefined && (Number(m[9]) > 23 || Number(m[10]) > 59)) return null;
  const date = new Date(value.toUpperCase());
  return Number.isNaN(date.getTime()) ? null : date;
}
