import { describe, expect, test } from "bun:test";
import { ID_PREFIXES, IdGenerator, type IdKind, isId } from "../../src/domain/ids.ts";

const CROCKFORD_ID = /^[0-9A-HJKMNP-TV-Z]{26}$/;
const T0 = Date.UTC(2026, 0, 15, 12, 0, 0, 0);

describe("id format", () => {
  test("every id kind is its prefix, an underscore and 26 Crockford characters", () => {
    const ids = new IdGenerator();
    for (const [kind, prefix] of Object.entries(ID_PREFIXES) as [IdKind, string][]) {
      const id = ids.next(kind, T0);
      expect(id.startsWith(`${prefix}_`)).toBe(true);
      const body = id.slice(prefix.length + 1);
      expect(body).toHaveLength(26);
      expect(body).toMatch(CROCKFORD_ID);
      expect(isId(kind, id)).toBe(true);
    }
  });

  test("the prefixes are the ones the design lists, plus blk for device blocks, olp for offline packages and asg for named-user assignments", () => {
    expect(Object.values(ID_PREFIXES).sort() as string[]).toEqual(
      [
        "prod",
        "pol",
        "cus",
        "lic",
        "act",
        "lse",
        "whk",
        "evt",
        "rsl",
        "ver",
        "usr",
        "req",
        "key",
        "blk",
        "olp",
        "asg",
      ].sort(),
    );
  });

  test("the first ten characters encode the millisecond timestamp in base 32", () => {
    const id = new IdGenerator().ulid(T0);
    let decoded = 0;
    for (const char of id.slice(0, 10))
      decoded = decoded * 32 + "0123456789ABCDEFGHJKMNPQRSTVWXYZ".indexOf(char);
    expect(decoded).toBe(T0);
  });
});

describe("ordering", () => {
  test("ids made at a later millisecond sort after ids made earlier", () => {
    const ids = new IdGenerator();
    const made: string[] = [];
    for (let i = 0; i < 200; i++) made.push(ids.next("license", T0 + i * 7));
    const sorted = [...made].sort();
    expect(made).toEqual(sorted);
  });

  test("ids from separate generators still sort by their millisecond", () => {
    const earlier = new IdGenerator().next("product", T0);
    const later = new IdGenerator().next("product", T0 + 1);
    expect(earlier < later).toBe(true);
  });

  test("ids made in the same millisecond keep increasing and never repeat", () => {
    const ids = new IdGenerator();
    const made: string[] = [];
    for (let i = 0; i < 1000; i++) made.push(ids.next("event", T0));
    for (let i = 1; i < made.length; i++) {
      expect((made[i - 1] as string) < (made[i] as string)).toBe(true);
    }
    expect(new Set(made).size).toBe(1000);
    for (const id of made) expect(id.slice(4, 14)).toBe((made[0] as string).slice(4, 14));
  });

  test("an unguessable id shares only the millisecond with the ids around it, not the counter", () => {
    const ids = new IdGenerator();
    const before = ids.next("request", T0);
    const made = Array.from({ length: 200 }, () => ids.unguessable("verification", T0));
    const after = ids.next("request", T0);
    for (const id of made) {
      expect(id).toMatch(/^ver_[0-9A-HJKMNP-TV-Z]{26}$/);
      expect(id.slice(4, 14)).toBe(before.slice(4, 14));
      const random = id.slice(14);
      expect(random > before.slice(4 + 10) && random < after.slice(4 + 10)).toBe(false);
    }
    expect(new Set(made.map((id) => id.slice(14))).size).toBe(made.length);
  });

  test("a clock that steps backwards does not produce an id that sorts before the previous one", () => {
    const ids = new IdGenerator();
    const first = ids.next("request", T0 + 5);
    const second = ids.next("request", T0);
    expect(first < second).toBe(true);
  });
});

describe("isId", () => {
  const good = `lic_${"01JD3Q4W5X6Y7Z8A9B0C1D2E3F"}`;

  test("accepts a well-formed id of the right kind", () => {
    expect(isId("license", good)).toBe(true);
  });

  test("rejects an id with another kind's prefix", () => {
    expect(isId("product", good)).toBe(false);
    expect(isId("license", `prod_${good.slice(4)}`)).toBe(false);
  });

  test("rejects an id without the underscore or with a different separator", () => {
    expect(isId("license", `lic${good.slice(4)}`)).toBe(false);
    expect(isId("license", `lic-${good.slice(4)}`)).toBe(false);
  });

  test("rejects lower-case characters in the body", () => {
    expect(isId("license", good.toLowerCase())).toBe(false);
    expect(isId("license", `lic_${"01jd3q4w5x6y7z8a9b0c1d2e3f"}`)).toBe(false);
  });

  test("rejects the letters Crockford base32 leaves out", () => {
    for (const letter of ["I", "L", "O", "U"]) {
      const id = `lic_${letter}${good.slice(5)}`;
      expect(id).toHaveLength(good.length);
      expect(isId("license", id)).toBe(false);
    }
  });

  test("rejects bodies that are one character too short or too long", () => {
    expect(isId("license", good.slice(0, -1))).toBe(false);
    expect(isId("license", `${good}0`)).toBe(false);
    expect(isId("license", "lic_")).toBe(false);
    expect(isId("license", "")).toBe(false);
  });

  test("rejects ids with surrounding whitespace or punctuation", () => {
    expect(isId("license", ` ${good}`)).toBe(false);
    expect(isId("license", `${good}\n`)).toBe(false);
    expect(isId("license", `lic_01JD3Q4W5X6Y7Z8A9B0C1D2E3-`)).toBe(false);
  });
});
