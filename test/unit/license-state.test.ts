import { describe, expect, test } from "bun:test";
import { addMonths, defaultExpiry, licenseStatus } from "../../src/domain/license-state.ts";

const NOW = new Date("2026-03-10T12:00:00.000Z");
const PAST = new Date(NOW.getTime() - 1000);
const FUTURE = new Date(NOW.getTime() + 1000);
const utc = (iso: string) => new Date(iso);

describe("licenseStatus", () => {
  test("an active license with no expiry is active", () => {
    expect(licenseStatus({ status: "active", expiresAt: null }, NOW)).toBe("active");
  });

  test("an active license that expires in the future is active", () => {
    expect(licenseStatus({ status: "active", expiresAt: FUTURE }, NOW)).toBe("active");
  });

  test("an active license past its expiry is expired", () => {
    expect(licenseStatus({ status: "active", expiresAt: PAST }, NOW)).toBe("expired");
  });

  test("a license whose expiry is exactly now counts as expired", () => {
    expect(licenseStatus({ status: "active", expiresAt: new Date(NOW.getTime()) }, NOW)).toBe("expired");
    expect(licenseStatus({ status: "active", expiresAt: new Date(NOW.getTime() + 1) }, NOW)).toBe("active");
  });

  test("a revoked license is revoked whether or not it has expired", () => {
    expect(licenseStatus({ status: "revoked", expiresAt: null }, NOW)).toBe("revoked");
    expect(licenseStatus({ status: "revoked", expiresAt: FUTURE }, NOW)).toBe("revoked");
    expect(licenseStatus({ status: "revoked", expiresAt: PAST }, NOW)).toBe("revoked");
  });

  test("a suspended license is suspended whether or not it has expired", () => {
    expect(licenseStatus({ status: "suspended", expiresAt: null }, NOW)).toBe("suspended");
    expect(licenseStatus({ status: "suspended", expiresAt: FUTURE }, NOW)).toBe("suspended");
    expect(licenseStatus({ status: "suspended", expiresAt: PAST }, NOW)).toBe("suspended");
  });

  test("the same license moves from active to expired as time passes", () => {
    const license = { status: "active" as const, expiresAt: NOW };
    expect(licenseStatus(license, PAST)).toBe("active");
    expect(licenseStatus(license, FUTURE)).toBe("expired");
  });
});

describe("addMonths", () => {
  test("January 31 plus one month is February 28 in a common year", () => {
    expect(addMonths(utc("2026-01-31T00:00:00.000Z"), 1).toISOString()).toBe("2026-02-28T00:00:00.000Z");
  });

  test("January 31 plus one month is February 29 in a leap year", () => {
    expect(addMonths(utc("2028-01-31T00:00:00.000Z"), 1).toISOString()).toBe("2028-02-29T00:00:00.000Z");
  });

  test("the time of day is kept, including the last minutes of a UTC day", () => {
    expect(addMonths(utc("2026-01-31T23:59:59.999Z"), 1).toISOString()).toBe("2026-02-28T23:59:59.999Z");
    expect(addMonths(utc("2026-03-31T00:00:00.001Z"), 1).toISOString()).toBe("2026-04-30T00:00:00.001Z");
  });

  test("days that exist in the target month are kept as they are", () => {
    expect(addMonths(utc("2026-01-15T08:30:00.000Z"), 1).toISOString()).toBe("2026-02-15T08:30:00.000Z");
    expect(addMonths(utc("2026-02-28T08:30:00.000Z"), 1).toISOString()).toBe("2026-03-28T08:30:00.000Z");
  });

  test("adding months crosses year boundaries and clamps at the target month's end", () => {
    expect(addMonths(utc("2026-12-31T10:00:00.000Z"), 2).toISOString()).toBe("2027-02-28T10:00:00.000Z");
    expect(addMonths(utc("2026-11-30T10:00:00.000Z"), 3).toISOString()).toBe("2027-02-28T10:00:00.000Z");
    expect(addMonths(utc("2027-08-31T10:00:00.000Z"), 6).toISOString()).toBe("2028-02-29T10:00:00.000Z");
  });

  test("February 29 plus twelve months is February 28 of the next year", () => {
    expect(addMonths(utc("2028-02-29T06:00:00.000Z"), 12).toISOString()).toBe("2029-02-28T06:00:00.000Z");
  });

  test("the input date is not modified", () => {
    const from = utc("2026-01-31T00:00:00.000Z");
    addMonths(from, 1);
    expect(from.toISOString()).toBe("2026-01-31T00:00:00.000Z");
  });

  test("the result is computed in UTC whatever the process time zone is", () => {
    const saved = process.env.TZ;
    try {
      for (const zone of ["Pacific/Kiritimati", "America/Los_Angeles", "Asia/Kolkata"]) {
        process.env.TZ = zone;
        expect(addMonths(utc("2026-01-31T23:30:00.000Z"), 1).toISOString()).toBe("2026-02-28T23:30:00.000Z");
        expect(addMonths(utc("2026-03-01T00:30:00.000Z"), 1).toISOString()).toBe("2026-04-01T00:30:00.000Z");
      }
    } finally {
      if (saved === undefined) delete process.env.TZ;
      else process.env.TZ = saved;
    }
  });
});

describe("defaultExpiry", () => {
  const now = utc("2026-01-31T10:00:00.000Z");

  test("a perpetual license never expires", () => {
    expect(
      defaultExpiry({ license_type: "perpetual", billing_cycle: "none", trial_days: 0 }, now),
    ).toBeNull();
  });

  test("a trial expires trial_days after now, to the millisecond", () => {
    const expiry = defaultExpiry({ license_type: "trial", billing_cycle: "none", trial_days: 14 }, now);
    expect(expiry?.toISOString()).toBe("2026-02-14T10:00:00.000Z");
    const one = defaultExpiry({ license_type: "trial", billing_cycle: "none", trial_days: 1 }, now);
    expect(one?.getTime()).toBe(now.getTime() + 86_400_000);
  });

  test("a monthly subscription expires one calendar month later", () => {
    const expiry = defaultExpiry(
      { license_type: "subscription", billing_cycle: "monthly", trial_days: 0 },
      now,
    );
    expect(expiry?.toISOString()).toBe("2026-02-28T10:00:00.000Z");
  });

  test("a quarterly subscription expires three calendar months later", () => {
    const expiry = defaultExpiry(
      { license_type: "subscription", billing_cycle: "quarterly", trial_days: 0 },
      now,
    );
    expect(expiry?.toISOString()).toBe("2026-04-30T10:00:00.000Z");
  });

  test("a yearly subscription expires twelve calendar months later", () => {
    const expiry = defaultExpiry(
      { license_type: "subscription", billing_cycle: "yearly", trial_days: 0 },
      now,
    );
    expect(expiry?.toISOString()).toBe("2027-01-31T10:00:00.000Z");
  });

  test("a subscription without a billing cycle expires after twelve months", () => {
    const expiry = defaultExpiry({ license_type: "subscription", billing_cycle: "none", trial_days: 0 }, now);
    expect(expiry?.toISOString()).toBe("2027-01-31T10:00:00.000Z");
  });

  test("the default expiry does not modify the given now", () => {
    const clock = utc("2026-01-31T10:00:00.000Z");
    defaultExpiry({ license_type: "subscription", billing_cycle: "monthly", trial_days: 0 }, clock);
    defaultExpiry({ license_type: "trial", billing_cycle: "none", trial_days: 3 }, clock);
    expect(clock.toISOString()).toBe("2026-01-31T10:00:00.000Z");
  });
});
