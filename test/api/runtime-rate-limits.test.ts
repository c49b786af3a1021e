import { afterEach, describe, expect, test } from "bun:test";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { TestDevice } from "../support/device.ts";
import { type CallResult, createTestContext, type TestContext } from "../support/harness.ts";
import { expectRateLimited } from "../support/rate-limits.ts";
import { activatedDevice, heartbeatPath, nowSec, proofCall, runtimeFixture } from "../support/runtime.ts";
import { runtimeEvents } from "../support/store-digest.ts";

/**
 * Runtime burst windows (DESIGN §4 "Rate limits"): per client address for unauthenticated calls,
 * per activation and per license for device-proof calls. Each app here gets small windows; the
 * test clock refills them.
 */
let t: TestContext;
afterEach(() => t.close());

const DIGEST = machineInfoDigest({ os: "linux", arch: "x64" });
const heartbeatOf = (device: TestDevice, activationId: string) =>
  proofCall(t, device, "POST", heartbeatPath(activationId), activationId, { machine_info_digest: DIGEST });

describe("per client address (unauthenticated runtime calls)", () => {
  test("the fourth call from one address in a window is refused with 429, Retry-After and RateLimit headers; other addresses go on", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 3, windowSec: 60 } } });
    const fx = await runtimeFixture(t);
    const from = (clientAddress: string) =>
      t.call("POST", "/runtime/v1/time", {
        key: null,
        body: { product_id: fx.productId, nonce: "a-time-nonce-of-enough-length" },
        clientAddress,
      });
    const first = await from("203.0.113.5");
    expect(first.status).toBe(200);
    expect(first.headers.get("ratelimit-policy")).toBe('"runtime-ip";q=3;w=60');
    expect(first.headers.get("ratelimit")).toBe('"runtime-ip";r=2;t=20');
    expect((await from("203.0.113.5")).status).toBe(200);
    expect((await from("203.0.113.5")).status).toBe(200);
    expectRateLimited(await from("203.0.113.5"), "runtime-ip", 3, 60);
    expect((await from("203.0.113.6")).status).toBe(200);
    t.clock.advance(20);
    expect((await from("203.0.113.5")).status).toBe(200);
    expect((await from("203.0.113.5")).status).toBe(429);
  });

  test("activation create, trust bundle, time and the verification routes share the address's window", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 6, windowSec: 60 } } });
    const fx = await runtimeFixture(t);
    const address = "198.51.100.20";
    const calls = [
      t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, {
        key: null,
        clientAddress: address,
      }),
      t.call("POST", "/runtime/v1/time", {
        key: null,
        body: { product_id: fx.productId, nonce: "a-time-nonce-of-enough-length" },
        clientAddress: address,
      }),
      t.call("POST", "/runtime/v1/activations", {
        key: null,
        body: new TestDevice().activationBody({
          licenseKey: fx.licenseKey,
          productId: fx.productId,
          clientTime: Math.floor(t.clock.now().getTime() / 1000),
        }),
        headers: { "idempotency-key": "rate-limit-activation-0001" },
        clientAddress: address,
      }),
      t.call("POST", "/runtime/v1/email-verifications", { key: null, body: {}, clientAddress: address }),
      t.call("POST", "/runtime/v1/trial-verifications", { key: null, body: {}, clientAddress: address }),
      t.call("POST", "/runtime/v1/trial-verifications/ver_x/confirm", {
        key: null,
        body: {},
        clientAddress: address,
      }),
    ];
    for (const call of calls) expect((await call).status).not.toBe(429);
    const refused = await t.call("POST", "/runtime/v1/email-verifications/ver_x/confirm", {
      key: null,
      body: {},
      clientAddress: address,
    });
    expectRateLimited(refused, "runtime-ip", 6, 60);
    const trust = await t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, {
      key: null,
      clientAddress: address,
    });
    expect(trust.status).toBe(429);
  });

  test("activation create with a trailing slash is limited per address too, and charges nothing to the activation its headers name", async () => {
    t = createTestContext({
      runtimeRateLimits: { ip: { limit: 3, windowSec: 60 }, activation: { limit: 2, windowSec: 60 } },
    });
    const fx = await runtimeFixture(t);
    const victim = await activatedDevice(t, fx);
    const attacker = new TestDevice();
    // A well-formed activation for a license key that does not exist (LICENSE_KEY_INVALID, an
    // answer after a verified activation proof), sent in the victim's name.
    const create = () =>
      t.call("POST", "/runtime/v1/activations/", {
        key: null,
        clientAddress: "203.0.113.80",
        body: attacker.activationBody({
          licenseKey: "LIC-NOT-A-REAL-KEY",
          productId: fx.productId,
          clientTime: nowSec(t),
        }),
        headers: {
          "idempotency-key": `slash-${Math.random().toString(36).slice(2)}-x`,
          "x-service-activation": victim.activationId,
        },
      });
    for (let i = 0; i < 3; i++) expect((await create()).body.error.code).toBe("LICENSE_KEY_INVALID");
    expectRateLimited(await create(), "runtime-ip", 3, 60);
    for (let i = 0; i < 2; i++)
      expect((await heartbeatOf(victim.device, victim.activationId)).status).toBe(200);
  });

  test("behind a trusted proxy the address is the last X-Forwarded-For entry; earlier entries are the client's and ignored", async () => {
    t = createTestContext({
      runtimeRateLimits: { ip: { limit: 1, windowSec: 60 } },
      trustForwardedFor: true,
    });
    const fx = await runtimeFixture(t);
    const bundle = (forwardedFor: string) =>
      t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, {
        key: null,
        clientAddress: "127.0.0.1",
        headers: { "x-forwarded-for": forwardedFor },
      });
    expect((await bundle("10.9.9.9, 203.0.113.1")).status).toBe(200);
    // A client cannot get a fresh window by inventing an earlier hop.
    expect((await bundle("10.8.8.8, 203.0.113.1")).status).toBe(429);
    expect((await bundle("203.0.113.2")).status).toBe(200);
  });

  test("behind a trusted proxy that writes source ports, every port of one client shares its window, and an entry that is no address counts as the proxy", async () => {
    t = createTestContext({
      runtimeRateLimits: { ip: { limit: 1, windowSec: 60 } },
      trustForwardedFor: true,
    });
    const fx = await runtimeFixture(t);
    const bundle = (forwardedFor: string) =>
      t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, {
        key: null,
        clientAddress: "127.0.0.1",
        headers: { "x-forwarded-for": forwardedFor },
      });
    expect((await bundle("203.0.113.1:51234")).status).toBe(200);
    expect((await bundle("203.0.113.1:51235")).status).toBe(429);
    expect((await bundle("[2001:db8:1:2::1]:443")).status).toBe(200);
    expect((await bundle("[2001:db8:1:2::7]:444")).status).toBe(429);
    expect((await bundle("garbage:1")).status).toBe(200);
    expect((await bundle("more-garbage")).status).toBe(429);
  });

  test("without a trusted proxy X-Forwarded-For is ignored", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 1, windowSec: 60 } } });
    const fx = await runtimeFixture(t);
    const bundle = (forwardedFor: string) =>
      t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, {
        key: null,
        clientAddress: "192.0.2.1",
        headers: { "x-forwarded-for": forwardedFor },
      });
    expect((await bundle("203.0.113.1")).status).toBe(200);
    expect((await bundle("203.0.113.2")).status).toBe(429);
  });

  test("IPv6 senders share one window per /64", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 1, windowSec: 60 } } });
    const fx = await runtimeFixture(t);
    const bundle = (clientAddress: string) =>
      t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, { key: null, clientAddress });
    expect((await bundle("2001:db8:0:1::1")).status).toBe(200);
    expect((await bundle("2001:db8:0:1::ffff")).status).toBe(429);
    expect((await bundle("2001:db8:0:2::1")).status).toBe(200);
  });

  test("CORS preflights are never limited and use up nothing", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 1, windowSec: 60 } } });
    const fx = await runtimeFixture(t);
    for (let i = 0; i < 5; i++) {
      const preflight = await t.call("OPTIONS", "/runtime/v1/activations", {
        key: null,
        clientAddress: "203.0.113.9",
        headers: { origin: "https://app.example.com", "access-control-request-method": "POST" },
      });
      expect(preflight.status).not.toBe(429);
    }
    const bundle = await t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, {
      key: null,
      clientAddress: "203.0.113.9",
    });
    expect(bundle.status).toBe(200);
  });
});

describe("per activation and per license (device-proof calls)", () => {
  const heartbeat = (device: TestDevice, activationId: string) =>
    proofCall(t, device, "POST", heartbeatPath(activationId), activationId, { machine_info_digest: DIGEST });

  test("the fourth check-in of one activation in a window is refused; another activation of the license goes on", async () => {
    t = createTestContext({ runtimeRateLimits: { activation: { limit: 3, windowSec: 60 } } });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const a = await activatedDevice(t, fx);
    const b = await activatedDevice(t, fx);
    for (let i = 0; i < 3; i++) {
      const ok = await heartbeat(a.device, a.activationId);
      expect(ok.status).toBe(200);
      expect(ok.headers.get("ratelimit-policy")).toBe('"runtime-activation";q=3;w=60');
      expect(ok.headers.get("ratelimit")).toStartWith(`"runtime-activation";r=${2 - i};`);
    }
    expectRateLimited(await heartbeat(a.device, a.activationId), "runtime-activation", 3, 60);
    // Every device-proof route of the activation shares its window.
    const deactivate = await proofCall(
      t,
      a.device,
      "DELETE",
      `/runtime/v1/activations/${a.activationId}`,
      a.activationId,
    );
    expect(deactivate.status).toBe(429);
    expect((await heartbeat(b.device, b.activationId)).status).toBe(200);
    t.clock.advance(20);
    expect((await heartbeat(a.device, a.activationId)).status).toBe(200);
  });

  test("check-ins sent at once are counted one by one: of ten with a window of three, three are answered and seven refused, none recorded", async () => {
    t = createTestContext({ runtimeRateLimits: { activation: { limit: 3, windowSec: 60 } } });
    const fx = await runtimeFixture(t);
    const { device, activationId } = await activatedDevice(t, fx);
    const answers = await Promise.all(Array.from({ length: 10 }, () => heartbeat(device, activationId)));
    expect(answers.map((a) => a.status).sort()).toEqual([200, 200, 200, 429, 429, 429, 429, 429, 429, 429]);
    expectRateLimited(answers.find((a) => a.status === 429) as CallResult, "runtime-activation", 3, 60);
    expect([...runtimeEvents(t.deps.sqlite).values()]).toEqual([]);
    // The window is spent, not overdrawn: it refills at one call per 20 s.
    expect((await heartbeat(device, activationId)).status).toBe(429);
    t.clock.advance(20);
    expect((await heartbeat(device, activationId)).status).toBe(200);
  });

  test("a license's window holds for its devices' calls sent at once", async () => {
    t = createTestContext({ runtimeRateLimits: { license: { limit: 4, windowSec: 60 } } });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const a = await activatedDevice(t, fx);
    const b = await activatedDevice(t, fx);
    const answers = await Promise.all(
      [a, b, a, b, a, b, a, b].map((d) => heartbeat(d.device, d.activationId)),
    );
    expect(answers.filter((r) => r.status === 200)).toHaveLength(4);
    for (const refused of answers.filter((r) => r.status !== 200))
      expectRateLimited(refused, "runtime-license", 4, 60);
  });

  test("a license's activations share its window; other licenses go on", async () => {
    t = createTestContext({ runtimeRateLimits: { license: { limit: 4, windowSec: 60 } } });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const other = await runtimeFixture(t);
    const a = await activatedDevice(t, fx);
    const b = await activatedDevice(t, fx);
    const c = await activatedDevice(t, other);
    for (const device of [a, b, a, b])
      expect((await heartbeat(device.device, device.activationId)).status).toBe(200);
    expectRateLimited(await heartbeat(a.device, a.activationId), "runtime-license", 4, 60);
    expectRateLimited(await heartbeat(b.device, b.activationId), "runtime-license", 4, 60);
    expect((await heartbeat(c.device, c.activationId)).status).toBe(200);
  });

  test("a refused call is never recorded in runtime_events, and costs the device no proof nonce", async () => {
    t = createTestContext({ runtimeRateLimits: { activation: { limit: 1, windowSec: 60 } } });
    const fx = await runtimeFixture(t);
    const { device, activationId } = await activatedDevice(t, fx);
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    expect((await heartbeat(device, activationId)).body.error.code).toBe("LICENSE_REVOKED");
    const recorded = [...runtimeEvents(t.deps.sqlite).values()];
    expect(recorded.map((row) => [row.code, row.occurrences])).toEqual([["LICENSE_REVOKED", 1]]);
    const nonce = "a-nonce-refused-by-the-limit-01";
    const refused = await proofCall(
      t,
      device,
      "POST",
      heartbeatPath(activationId),
      activationId,
      {
        machine_info_digest: DIGEST,
      },
      { nonce },
    );
    expect(refused.status).toBe(429);
    expect([...runtimeEvents(t.deps.sqlite).values()]).toEqual(recorded);
    // The refused request never reached the proof check, so its nonce is still unused.
    t.clock.advance(60);
    const retried = await proofCall(
      t,
      device,
      "POST",
      heartbeatPath(activationId),
      activationId,
      {
        machine_info_digest: DIGEST,
      },
      { nonce },
    );
    expect(retried.body.error.code).toBe("LICENSE_REVOKED");
  });

  test("revoked and expired denials use up the burst window", async () => {
    t = createTestContext({ runtimeRateLimits: { activation: { limit: 2, windowSec: 60 } } });
    const fx = await runtimeFixture(t);
    const { device, activationId } = await activatedDevice(t, fx);
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    expect((await heartbeat(device, activationId)).body.error.code).toBe("LICENSE_REVOKED");
    expect((await heartbeat(device, activationId)).body.error.code).toBe("LICENSE_REVOKED");
    expect((await heartbeat(device, activationId)).status).toBe(429);
  });

  test("lease routes are limited per activation and license too", async () => {
    t = createTestContext({ runtimeRateLimits: { activation: { limit: 2, windowSec: 60 } } });
    const fx = await runtimeFixture(t, {
      policy: { license_type: "subscription", concurrency_unit: "instance", max_concurrent: 5 },
    });
    const { device, activationId } = await activatedDevice(t, fx);
    const acquire = (instance: string) =>
      proofCall(t, device, "POST", "/runtime/v1/leases", activationId, {
        activation_id: activationId,
        instance_id: instance,
      });
    expect((await acquire("i-1")).status).not.toBe(429);
    expect((await acquire("i-2")).status).not.toBe(429);
    expect((await acquire("i-3")).status).toBe(429);
  });
});

/**
 * Failing device proofs cost a signature check each, so they have windows of their own: per
 * sender address and activation named, and per sender address for the total. Many genuine
 * devices can share one address (NAT, CGNAT, an IPv6 /64, a proxy not trusted for
 * X-Forwarded-For), so nothing an attacker sends from there may refuse them.
 */
