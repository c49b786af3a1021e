import { describe, expect, test } from "bun:test";
import {
  delayAfterError,
  type HeartbeatResult,
  type LoopStopReason,
  MAX_RETRY_AFTER_MS,
  SdkError,
} from "../../src/sdk/index.ts";
import { T0 } from "./support/authority.ts";
import { FakeServer, type SeenRequest } from "./support/fake-server.ts";
import { activated } from "./support/setup.ts";

const isHeartbeat = (req: SeenRequest) => req.path.endsWith("/heartbeat") && req.path.includes("activations");

async function loopHarness(random = () => 0.5) {
  const h = await activated({ random, backoff: { baseMs: 1000, maxMs: 8000 } });
  const events: string[] = [];
  const stops: LoopStopReason[] = [];
  const results: HeartbeatResult[] = [];
  await h.client.startHeartbeatLoop({
    onHeartbeat: (r) => {
      results.push(r);
      events.push(`ok ${r.nextHeartbeatIn}`);
    },
    onError: (e, ms) => events.push(`error ${(e as { code?: string }).code} ${ms}`),
    onStop: (reason) => stops.push(reason),
  });
  const heartbeats = () => h.server.requests.filter(isHeartbeat).length;
  return { ...h, events, stops, results, heartbeats };
}

describe("heartbeat loop", () => {
  test("the first heartbeat runs at once and the next one after next_heartbeat_in seconds", async () => {
    const h = await loopHarness();
    expect(h.timer.pending()).toEqual([0]);
    expect(h.heartbeats()).toBe(0);
    await h.timer.runNext();
    expect(h.heartbeats()).toBe(1);
    expect(h.timer.pending()).toEqual([900_000]);
    h.server.heartbeatInterval = 120;
    await h.timer.runNext();
    expect(h.heartbeats()).toBe(2);
    expect(h.timer.pending()).toEqual([120_000]);
    expect(h.events).toEqual(["ok 900", "ok 120"]);
    expect(h.client.heartbeatLoopRunning).toBe(true);
  });

  test("after a restart the loop waits for the rest of the interval the server asked for", async () => {
    const h = await loopHarness();
    await h.timer.runNext();
    h.client.stop();
    h.clock.ms += 100_000;
    await h.client.startHeartbeatLoop();
    expect(h.timer.pending()).toEqual([800_000]);
  });

  test("429 and 503 answers are retried after exactly their Retry-After", async () => {
    const h = await loopHarness();
    h.server.handlers = [
      (req) =>
        isHeartbeat(req) ? FakeServer.error(429, "RATE_LIMITED", {}, { "retry-after": "120" }) : undefined,
    ];
    await h.timer.runNext();
    expect(h.timer.pending()).toEqual([120_000]);
    h.server.handlers = [
      (req) =>
        isHeartbeat(req) ? FakeServer.error(503, "UNAVAILABLE", {}, { "retry-after": "30" }) : undefined,
    ];
    await h.timer.runNext();
    expect(h.timer.pending()).toEqual([30_000]);
    expect(h.events).toEqual(["error RATE_LIMITED 120000", "error UNAVAILABLE 30000"]);
  });

  test("a Retry-After longer than an hour is honoured for an hour: an unsigned header cannot silence the device for a month", async () => {
    const h = await loopHarness();
    h.server.handlers = [
      (req) =>
        isHeartbeat(req)
          ? FakeServer.error(503, "SERVICE_UNAVAILABLE", {}, { "retry-after": "2592000" })
          : undefined,
    ];
    await h.timer.runNext();
    expect(h.timer.pending()).toEqual([MAX_RETRY_AFTER_MS]);
    expect(MAX_RETRY_AFTER_MS).toBe(3_600_000);
  });

  test("an interval longer than a timer holds (30 days) is waited out in chained timers, and the heartbeat runs only at its end", async () => {
    const h = await loopHarness();
    h.server.heartbeatInterval = 30 * 86_400;
    await h.timer.runNext();
    expect(h.heartbeats()).toBe(1);
    // Every delay handed to the timer fits in it; past 2^31 - 1 ms a timer fires at once.
    expect(h.timer.pending()).toEqual([2 ** 31 - 1]);
    await h.timer.runNext();
    expect(h.heartbeats()).toBe(1);
    expect(h.timer.pending()).toEqual([30 * 86_400_000 - (2 ** 31 - 1)]);
    await h.timer.runNext();
    expect(h.heartbeats()).toBe(2);
    expect(h.timer.now).toBe(30 * 86_400_000);
    // stop() cancels a wait in any of its links.
    await h.timer.runNext();
    h.client.stop();
    expect(h.timer.pending()).toEqual([]);
    expect(Math.max(...h.timer.requested)).toBeLessThanOrEqual(2 ** 31 - 1);
  });

  test("network errors and 5xx back off exponentially with full jitter up to the cap, and success resets it", async () => {
    const draws = [0.5, 0.25, 1 - 1e-9, 0.5, 0.5, 0.5];
    const h = await loopHarness(() => draws.shift() ?? 0.5);
    let failing = true;
    h.server.handlers = [
      (req) => (isHeartbeat(req) && failing ? FakeServer.error(500, "INTERNAL") : undefined),
    ];
    const delays: number[] = [];
    for (let i = 0; i < 5; i++) {
      await h.timer.runNext();
      delays.push(h.timer.pending()[0]!);
    }
    // ceilings 1000, 2000, 4000, 8000, 8000 (capped) times the random draws
    expect(delays).toEqual([500, 500, 3999, 4000, 4000]);
    failing = false;
    await h.timer.runNext();
    expect(h.timer.pending()).toEqual([900_000]);
    h.server.handlers = [
      () => {
        throw new TypeError("unreachable");
      },
    ];
    await h.timer.runNext();
    expect(h.events.at(-1)).toBe("error NETWORK_ERROR 500");
  });

  test("a response that fails verification is retried with back-off, not believed", async () => {
    const h = await loopHarness(() => 0);
    h.server.mutate = (env, req) => {
      if (isHeartbeat(req)) (env.data as Record<string, unknown>).next_heartbeat_in = 1;
      return env;
    };
    await h.timer.runNext();
    expect(h.events).toEqual(["error BODY_HASH_MISMATCH 0"]);
    expect(h.results).toEqual([]);
  });

  for (const [status, code] of [
    [403, "LICENSE_REVOKED"],
    [403, "LICENSE_EXPIRED"],
    [410, "ACTIVATION_DEACTIVATED"],
  ] as const) {
    test(`an authentic ${code} stops the loop for good`, async () => {
      const h = await loopHarness();
      h.server.handlers = [(req) => (isHeartbeat(req) ? h.server.denial(req, status, code) : undefined)];
      await h.timer.runNext();
      expect(h.stops).toEqual([code]);
      expect(h.timer.pending()).toEqual([]);
      expect(h.client.heartbeatLoopRunning).toBe(false);
    });
  }

  test("an authentic LICENSE_REVOKED naming another activation does not stop the loop", async () => {
    const h = await loopHarness();
    h.server.handlers = [
      (req) =>
        isHeartbeat(req)
          ? h.server.denial(req, 403, "LICENSE_REVOKED", { activation_id: "act_someone_else" })
          : undefined,
    ];
    await h.timer.runNext();
    expect(h.stops).toEqual([]);
    expect(h.events).toEqual(["error ACTIVATION_MISMATCH 500"]);
    expect(h.client.heartbeatLoopRunning).toBe(true);
  });

  test("a heartbeat overtaken by a stored LICENSE_EXPIRED of its own second backs off instead of stopping; the next answer lifts it", async () => {
    const h = await loopHarness();
    // A lease call hears LICENSE_EXPIRED at T0; the license is renewed within that second and the
    // loop's heartbeat is answered "active", also at T0: which came first cannot be told.
    h.server.handlers = [
      (req) => (req.path === "/runtime/v1/leases" ? h.server.denial(req, 403, "LICENSE_EXPIRED") : undefined),
    ];
    await h.client.acquireLease("i1").catch(() => undefined);
    await h.timer.runNext();
    expect(h.stops).toEqual([]);
    expect(h.events).toEqual(["error LICENSE_EXPIRED 500"]);
    expect(await h.client.licenseInfo()).toMatchObject({ state: "invalid", reason: "license_expired" });
    h.server.sign = () => ({ serverTime: T0 + 1 });
    await h.timer.runNext();
    expect(h.events).toEqual(["error LICENSE_EXPIRED 500", "ok 900"]);
    expect(await h.client.licenseState()).toBe("valid");
  });

  test("an unsigned LICENSE_REVOKED does not stop the loop", async () => {
    const h = await loopHarness();
    h.server.handlers = [(req) => (isHeartbeat(req) ? FakeServer.error(403, "LICENSE_REVOKED") : undefined)];
    await h.timer.runNext();
    expect(h.stops).toEqual([]);
    expect(h.timer.pending()).toEqual([500]);
  });

  test("stop() cancels the pending heartbeat and an in-flight one schedules nothing", async () => {
    const h = await loopHarness();
    await h.timer.runNext();
    h.client.stop();
    expect(h.timer.pending()).toEqual([]);
    expect(h.stops).toEqual(["stopped"]);

    const late: HeartbeatResult[] = [];
    await h.client.startHeartbeatLoop({ onHeartbeat: (r) => late.push(r) });
    h.clock.ms += 900_000;
    h.server.serverTime += 900;
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const originalFetch = h.server.fetch;
    h.server.fetch = async (url, init) => {
      await gate;
      return originalFetch(url, init);
    };
    const inFlight = h.timer.runNext();
    h.client.stop();
    release();
    await inFlight;
    expect(h.heartbeats()).toBe(2);
    expect(late).toEqual([]);
    expect(h.timer.pending()).toEqual([]);
  });

  test("deactivation stops the loop", async () => {
    const h = await loopHarness();
    await h.timer.runNext();
    await h.client.deactivate();
    expect(h.client.heartbeatLoopRunning).toBe(false);
    expect(h.timer.pending()).toEqual([]);
    expect(h.stops).toEqual(["stopped"]);
  });

  test("starting the loop before activation fails with NOT_ACTIVATED", async () => {
    const h = await loopHarness();
    await h.client.deactivate();
    await expect(h.client.startHeartbeatLoop()).rejects.toMatchObject({ code: "NOT_ACTIVATED" });
  });

  test("only an authentic license denial stops the loop, whatever the code says", () => {
    const backoff = { baseMs: 1000, maxMs: 8000 };
    const signed = new SdkError("LICENSE_REVOKED", "revoked", { kind: "license", status: 403 });
    const unsigned = new SdkError("LICENSE_REVOKED", "revoked", { kind: "server", status: 403 });
    const suspended = new SdkError("LICENSE_SUSPENDED", "suspended", { kind: "license", status: 403 });
    expect(delayAfterError(signed, 1, () => 0.5, backoff)).toEqual({ stop: "LICENSE_REVOKED" });
    expect(delayAfterError(unsigned, 1, () => 0.5, backoff)).toEqual({ delayMs: 500 });
    expect(delayAfterError(suspended, 3, () => 0.5, backoff)).toEqual({ delayMs: 2000 });
  });
});
