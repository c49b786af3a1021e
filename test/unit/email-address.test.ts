import { expect, test } from "bun:test";
import { EMAIL_ADDRESS_PATTERN, parseEmailAddress } from "../../src/domain/email-address.ts";

const pattern = new RegExp(EMAIL_ADDRESS_PATTERN);

test("a plain address is kept as typed for mailing and lower-cased for its lookup key", () => {
  expect(parseEmailAddress("Ada.Lovelace+News@Example.COM")).toEqual({
    address: "Ada.Lovelace+News@example.com",
    normalized: "ada.lovelace+news@example.com",
  });
  expect(parseEmailAddress("o'brien_{x}/y=z?#$%&*^`|~-!@mail.example.org")?.address).toBe(
    "o'brien_{x}/y=z?#$%&*^`|~-!@mail.example.org",
  );
});

test("display names, groups, lists, comments, quotes and routes are refused, by the pattern and the parser alike", () => {
  const forms = [
    "x1<victim@example.com>",
    "<victim@example.com>",
    "Name <victim@example.com>",
    "a@example.com,victim@example.com",
    "a@example.com;victim@example.com",
    "group:victim@example.com;",
    "victim@example.com (comment)",
    "(c)victim@example.com",
    '"quoted"@example.com',
    '"a@b"@example.com',
    "a\\@b@example.com",
    "victim@[127.0.0.1]",
    "@route:victim@example.com",
    "a@b@example.com",
  ];
  for (const form of forms) {
    expect(parseEmailAddress(form)).toBeNull();
    expect(pattern.test(form)).toBe(false);
  }
});

test("whitespace and control characters anywhere are refused", () => {
  for (const form of [
    " a@example.com",
    "a@example.com ",
    "a @example.com",
    "a@exa mple.com",
    "a@example.com\r\nBcc: victim@example.com",
    "a\t@example.com",
    "a\u0000@example.com",
    "a@example.com\u0085",
    "a@exam\u00a0ple.com",
    "a@exam\u2028ple.com",
    "a@exam\u3000ple.com",
  ]) {
    expect(parseEmailAddress(form)).toBeNull();
  }
});

test("dots may only separate atoms of the local part; the domain needs a dot and LDH labels", () => {
  for (const form of [
    ".a@example.com",
    "a.@example.com",
    "a..b@example.com",
    "a@example",
    "a@.example.com",
    "a@example..com",
    "a@example.com.",
    "a@-example.com",
    "a@example-.com",
    "a@exa_mple.com",
    "a@1.2.3.4",
    "a@",
    "@example.com",
    "",
  ]) {
    expect(parseEmailAddress(form)).toBeNull();
  }
  expect(parseEmailAddress("a.b.c@sub-1.example.co.uk")?.address).toBe("a.b.c@sub-1.example.co.uk");
});

test("an international domain becomes punycode; lookalike full-width punctuation cannot smuggle a second address", () => {
  expect(parseEmailAddress("Jürgen@Bücher.example")).toBeNull(); // the local part stays ASCII
  expect(parseEmailAddress("juergen@Bücher.example")).toEqual({
    address: "juergen@xn--bcher-kva.example",
    normalized: "juergen@xn--bcher-kva.example",
  });
  // NFC first: a decomposed ü is the same domain.
  expect(parseEmailAddress("juergen@Bu\u0308cher.example")?.normalized).toBe("juergen@xn--bcher-kva.example");
  // Only an ASCII dot separates labels: a full-width one is not taken for one.
  expect(parseEmailAddress("a@example\uff0ecom")).toBeNull();
  expect(parseEmailAddress("a@exa\uff1cmple.com")).toBeNull();
  expect(parseEmailAddress("a@\uff11\uff12\uff17.\uff10.\uff10.\uff11")).toBeNull();
});

test("length limits: 64 for the local part, 63 per label, 254 in all", () => {
  const label = "d".repeat(63);
  expect(parseEmailAddress(`${"l".repeat(64)}@example.com`)).not.toBeNull();
  expect(parseEmailAddress(`${"l".repeat(65)}@example.com`)).toBeNull();
  expect(parseEmailAddress(`a@${label}.com`)).not.toBeNull();
  expect(parseEmailAddress(`a@${label}d.com`)).toBeNull();
  const domain = `${label}.${label}.${label}.${"d".repeat(57)}.com`; // 253 characters
  expect(parseEmailAddress(`a@${domain}`)).toBeNull();
  const fits = `${"l".repeat(64)}@${label}.${label}.${"d".repeat(57)}.com`; // 254 characters
  expect(fits.length).toBe(254);
  expect(parseEmailAddress(fits)).not.toBeNull();
  expect(parseEmailAddress(`l${fits}`)).toBeNull();
  expect(parseEmailAddress(`a@${"é".repeat(5000)}.com`)).toBeNull();
});
