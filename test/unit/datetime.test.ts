import { describe, expect, test } from "bun:test";
import { parseDateTime } from "../../src/domain/datetime.ts";

describe("parseDateTime reads RFC 3339 date-times strictly", () => {
  test.each([
    ["2030-01-31T00:00:00Z", "2030-01-31T00:00:00.000Z"],
    ["2030-01-31t00:00:00z", "2030-01-31T00:00:00.000Z"],
    ["2030-01-31T01:30:00+01:30", "2030-01-31T00:00:00.000Z"],
    ["2028-02-29T23:59:59.5Z", "2028-02-29T23:59:59.500Z"],
  ])("%s is the instant %s", (text, instant) => {
    expect(parseDateTime(text)?.toISOString()).toBe(instant);
  });

  test.each([
    "2030-02-31T00:00:00Z",
    "2029-02-29T00:00:00Z",
    "2030-01-31T24:00:00Z",
    "2030-01-31T00:00:00",
    "2030-01-31T00:00:00+24:00",
    "2030-01-31",
    "2030",
    "Jan 31 2030",
    "1969-12-31T23:59:59Z",
    "2030-01-31 00:00:00Z",
  ])("%s is refused", (text) => {
    expect(parseDateTime(text)).toBeNull();
  });
});
