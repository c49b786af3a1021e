import { describe, expect, test } from "bun:test";
import { addressPartition } from "../../src/http/client-address.ts";
import { GcraLimiter } from "../../src/http/rate-limit.ts";
import { countsTowardAllowance } from "../../src/http/runtime-limits.ts";
import { classifyRuntimeRequest } from "../../src/http/runtime-routes.ts";

describe("runtime route classes", () => {
  const cases: [string, string, string | null][] = [
    ["GET", "/runtime/v1/products/prod_1/trust-bundle", "address/counts"],
    ["POST", "/runtime/v1/time", "address/counts"],
    ["POST", "/runtime/v1/activations", "address/counts"],
    ["POST", "/runtime/v1/activations/act_1/heartbeat", "device/counts"],
    ["DELETE", "/runtime/v1/activations/act_1", "device/counts"],
    ["POST", "/runtime/v1/activations/act_1/sealed-file-keys", "device/counts"],
    ["POST", "/runtime/v1/leases", "device/counts"],
    ["POST", "/runtime/v1/leases/lse_1/heartbeat", "device/counts"],
    ["DELETE", "/runtime/v1/leases/lse_1", "device/counts"],
    ["POST", "/runtime/v1/email-verifications", "address/never"],
    ["POST", "/runtime/v1/email-verifications/ver_1/confirm", "address/never"],
    ["POST", "/runtime/v1/trial-verifications", "address/never"],
    ["POST", "/runtime/v1/trial-verifications/ver_1/confirm", "address/activation"],
    // The router takes one trailing slash as the same route; so do the classes.
    ["POST", "/runtime/v1/activations/", "address/counts"],
    ["POST", "/runtime/v1/trial-verifications/ver_1/confirm/", "address/activation"],
    ["POST", "/runtime/v1/leases/", "device/counts"],
    ["POST", "/runtime/v1/activations/act_1/heartbeat/", "device/counts"],
    // A runtime route added later is limited per address and counted until someone says otherwise.
    ["POST", "/runtime/v1/something-new", "address/counts"],
    ["GET", "/runtime/v2/time", "address/counts"],
    // Preflights are never limited or counted (spec §8); nothing outside /runtime/ is a runtime call.
    ["OPTIONS", "/runtime/v1/activations", null],
    ["OPTIONS", "/runtime/v1/activations/act_1/heartbeat", null],
    ["GET", "/mgmt/v1/plan", null],
    ["GET", "/healthz", null],
    ["GET", "/runtimex/v1/time", null],
    // The passkey pages' calls: unauthenticated, per address, never metered; the pages are not.
    ["POST", "/passkeys/v1/register/options", "address/never"],
    ["POST", "/passkeys/v1/register", "address/never"],
    ["POST", "/passkeys/v1/approve/options", "address/never"],
    ["POST", "/passkeys/v1/approve/", "address/never"],
    ["GET", "/passkeys/v1/approve", null],
    ["OPTIONS", "/passkeys/v1/approve", null],
  ];
  test.each(cases)("%s %s is %s", (method, path, expected) => {
    const kind = classifyRuntimeRequest(method, path);
    expect(kind ? `${kind.partition}/${kind.metering}` : null).toBe(expected);
  });

  test("only Runtime API calls are refused by an ended plan, not the passkey pages' calls", () => {
    expect(classifyRuntimeRequest("POST", "/runtime/v1/email-verifications/ver_1/confirm")?.planGated).toBe(
      true,
    );
    expect(classifyRuntimeRequest("POST", "/passkeys/v1/approve")?.planGated).toBe(false);
  });
});

describe("what counts toward the monthly Runtime allowance", () => {
  test("every answer of a counting route counts, except revoked and expired denials", () => {
    expect(countsTowardAllowance("counts", 200, undefined, false)).toBe(true);
    expect(countsTowardAllowance("counts", 201, undefined, true)).toBe(true);
    expect(countsTowardAllowance("counts", 401, "DEVICE_PROOF_INVALID", false)).toBe(true);
    expect(countsTowardAllowance("counts", 403, "LICENSE_SUSPENDED", false)).toBe(true);
    expect(countsTowardAllowance("counts", 403, "LICENSE_REVOKED", false)).toBe(false);
    expect(countsTowardAllowance("counts", 403, "LICENSE_EXPIRED", false)).toBe(false);
  });

  test("refusals by the limits, an ended plan and our own failures never count", () => {
    expect(countsTowardAllowance("counts", 429, "RATE_LIMITED", false)).toBe(false);
    expect(countsTowardAllowance("counts", 402, "PLAN_ENDED", false)).toBe(false);
    expect(countsTowardAllowance("counts", 503, "SERVICE_UNAVAILABLE", false)).toBe(false);
  });

  test("verification calls never count; trial confirm counts once, as the activation it creates", () => {
    expect(countsTowardAllowance("never", 202, undefined, false)).toBe(false);
    expect(countsTowardAllowance("never", 200, undefined, false)).toBe(false);
    expect(countsTowardAllowance("activation", 201, undefined, false)).toBe(true);
    expect(countsTowardAllowance("activation", 201, undefined, true)).toBe(false);
    expect(countsTowardAllowance("activation", 401, "EMAIL_VERIFICATION_CODE_INVALID", false)).toBe(false);
  });
});

describe("address partitions", () => {
  test("IPv4 addresses are their own partition", () => {
    expect(addressPartition("203.0.113.7")).toBe("203.0.113.7");
  });

  test("IPv6 addresses share one partition per /64, however they are written", () => {
    const a = addressPartition("2001:db8:1:2::1");
    expect(a).toBe("2001:db8:1:2::/64");
    expect(addressPartition("2001:0db8:0001:0002:ffff:ffff:ffff:ffff")).toBe(a);
    expect(addressPartition("2001:DB8:1:2:0:0:0:9")).toBe(a);
    expect(addressPartition("2001:db8:1:3::1")).not.toBe(a);
    expect(addressPartition("::1")).toBe("0:0:0:0::/64");
    expect(addressPartition("fe80::1%eth0")).toBe("fe80:0:0:0::/64");
  });

  test("IPv4-mapped IPv6 counts as the IPv4 address", () => {
    expect(addressPartition("::ffff:203.0.113.7")).toBe("203.0.113.7");
  });
});

describe("GCRA peek and charge", () => {
  const policy = { name: "t", limit: 3, windowSec: 60 };

  test("peek changes nothing; charge takes one, even from an empty bucket", () => {
    const limiter = new GcraLimiter(policy);
    for (let i = 0; i < 5; i++) expect(limiter.peek("k", 0).allowed).toBe(true);
    limiter.charge("k", 0);
    limiter.charge("k", 0);
    expect(limiter.peek("k", 0).remaining).toBe(0);
    limiter.charge("k", 0);
    expect(limiter.peek("k", 0)).toMatchObject({ allowed: false, retryAfterSec: 20 });
  });

  test("charging past the limit refuses for at most one more window after the key stops", () => {
    const limiter = new GcraLimiter(policy);
    for (let i = 0; i < 100; i++) limiter.charge("k", 0);
    // Debt is capped at two windows ahead: the next request waits one window plus one interval.
    expect(limiter.peek("k", 0).retryAfterSec).toBe(80);
    expect(limiter.peek("k", 79_000).allowed).toBe(false);
    expect(limiter.peek("k", 80_000).allowed).toBe(true);
  });

  test("allows answers what peek does, changing nothing", () => {
    const limiter = new GcraLimiter({ name: "t", limit: 7, windowSec: 60 });
    for (let charged = 0; charged < 12; charged++) {
      for (const at of [0, 1, 8_570, 8_572, 30_000, 60_000, 120_000]) {
        expect(limiter.allows("k", at)).toBe(limiter.peek("k", at).allowed);
      }
      limiter.charge("k", 0);
    }
    expect(limiter.allows("other", 0)).toBe(true);
    expect(limiter.size).toBe(1);
  });

  test("check is peek and charge together", () => {
    const limiter = new GcraLimiter(policy);
    expect([1, 2, 3, 4].map(() => limiter.check("k", 0).allowed)).toEqual([true, true, true, false]);
    expect(limiter.check("k", 20_000).allowed).toBe(true);
    expect(limiter.check("k", 20_000).allowed).toBe(false);
  });
});
