import { expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import {
  CODE_MAX_ATTEMPTS,
  type CodeState,
  checkCode,
  codeMatches,
  generateCode,
  hashCode,
} from "../../src/domain/verification-code.ts";

const secrets = new SecretBox(randomBytes(32));
const now = new Date("2026-11-22T12:00:00Z");
const state = (code: string, over: Partial<CodeState> = {}): CodeState => ({
  id: "ver_1",
  codeHash: hashCode(secrets, "ver_1", code),
  attempts: 0,
  expiresAt: new Date(now.getTime() + 600_000),
  closedAt: null,
  ...over,
});

test("codes are six digits and every digit position takes every value", () => {
  const seen = Array.from({ length: 6 }, () => new Set<string>());
  for (let i = 0; i < 2000; i++) {
    const code = generateCode();
    expect(code).toMatch(/^[0-9]{6}$/);
    for (let p = 0; p < 6; p++) seen[p]?.add(code[p] as string);
  }
  for (const digits of seen) expect(digits.size).toBe(10);
});

test("a code's hash is bound to its verification and never equals the code", () => {
  expect(hashCode(secrets, "ver_1", "123456")).not.toBe(hashCode(secrets, "ver_2", "123456"));
  expect(hashCode(secrets, "ver_1", "123456")).not.toContain("123456");
  expect(codeMatches(secrets, "ver_1", "123456", hashCode(secrets, "ver_1", "123456"))).toBe(true);
  expect(codeMatches(secrets, "ver_2", "123456", hashCode(secrets, "ver_1", "123456"))).toBe(false);
  expect(codeMatches(secrets, "ver_1", "12345", hashCode(secrets, "ver_1", "12345"))).toBe(false);
});

test("each check uses an attempt, right or wrong, and the sixth is refused as expired", () => {
  let s = state("000111");
  for (let i = 1; i <= CODE_MAX_ATTEMPTS; i++) {
    const result = checkCode(secrets, s, "999999", now);
    expect(result).toEqual({ outcome: "invalid", attempts: i, remainingAttempts: CODE_MAX_ATTEMPTS - i });
    s = { ...s, attempts: i };
  }
  expect(checkCode(secrets, s, "000111", now)).toEqual({ outcome: "expired" });
});

test("a right code matches, unless the address or device key is wrong, after 10 minutes, or once closed", () => {
  expect(checkCode(secrets, state("000111"), "000111", now)).toEqual({
    outcome: "match",
    attempts: 1,
    remainingAttempts: 4,
  });
  expect(checkCode(secrets, state("000111"), "000111", now, true).outcome).toBe("invalid");
  expect(checkCode(secrets, state("000111"), "000111", new Date(now.getTime() + 600_000)).outcome).toBe(
    "expired",
  );
  expect(checkCode(secrets, state("000111", { closedAt: now }), "000111", now).outcome).toBe("expired");
});
