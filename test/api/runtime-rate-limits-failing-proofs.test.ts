import { afterEach, describe, expect, test } from "bun:test";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { TestDevice } from "../support/device.ts";
import { type CallResult, createTestContext, type TestContext } from "../support/harness.ts";
import { expectRateLimited } from "../support/rate-limits.ts";
import {
  activatedDevice,
  heartbeatPath,
  nowSec,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";

/**
 * The failing-proof windows (docs/api.md "Rate limits"): device-proof requests whose proof never
 * verified are charged to the sender's address, never to the activation they name, and never lock
 * out the genuine devices behind a shared address. The other windows: runtime-rate-limits.test.ts.
 */
let t: TestContext;
afterEach(() => t.close());

const DIGEST = machineInfoDigest({ os: "linux", arch: "x64" });

describe("failing device proofs", () => {
  const heartbeatFrom = (device: TestDevice, activationId: string, clientAddress: string) => {
    const text = JSON.stringify({ machine_info_digest: DIGEST });
    const path = heartbeatPath(activationId);
    return t.call("POST", path, {
      key: null,
      rawBody: text,
      clientAddress,
      headers: {
        "content-type": "application/json",
        ...device.proofHeaders("POST", path, activationId, text, { timestamp: nowSec(t) }),
      },
    });
  };
  /** Activations use up the default address's `runtime-ip` window too: one more per 20 s with q=3;w=60. */
  const activatedLater = (fx: RuntimeFixture) => {
    t.clock.advance(20);
    return activatedDevice(t, fx);
  };

  test("forged proofs and made-up activation ids from a shared address do not lock out the genuine devices behind it", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 3, windowSec: 60 } } });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const nat = "203.0.113.80";
    const a = await activatedLater(fx);
    const b = await activatedLater(fx);
    const known = await activatedLater(fx);
    const attacker = new TestDevice();
    for (let i = 0; i < 3; i++) {
      const forged = await heartbeatFrom(attacker, known.activationId, nat);
      expect(forged.body.error.code).toBe("DEVICE_PROOF_INVALID");
    }
    // Made-up ids cost no signature check; past the address's window they are refused unread.
    const madeUp = await heartbeatFrom(attacker, "act_0000000000000000000000000000", nat);
    expectRateLimited(madeUp, "runtime-ip-unproven", 3, 60);
    for (let i = 0; i < 2; i++) {
      expect((await heartbeatFrom(a.device, a.activationId, nat)).status).toBe(200);
      expect((await heartbeatFrom(b.device, b.activationId, nat)).status).toBe(200);
    }
  });

  test("device calls to a path no route serves are charged to the sender's failing-proof windows, never to the activation they name", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 3, windowSec: 60 } } });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const nat = "203.0.113.81";
    const named = await activatedLater(fx);
    const bystander = await activatedLater(fx);
    const unrouted = `${heartbeatPath(named.activationId)}-unknown`;
    for (let i = 0; i < 3; i++) {
      const text = JSON.stringify({ machine_info_digest: DIGEST });
      const answer = await t.call("POST", unrouted, {
        key: null,
        rawBody: text,
        clientAddress: nat,
        headers: {
          "content-type": "application/json",
          ...named.device.proofHeaders("POST", unrouted, named.activationId, text, { timestamp: nowSec(t) }),
        },
      });
      expect(answer.status).toBe(404);
      expect(answer.body.error.code).toBe("NOT_FOUND");
    }
    // The address's window is used up: made-up ids and the activation named are refused from it ...
    expectRateLimited(
      await heartbeatFrom(new TestDevice(), "act_0000000000000000000000000000", nat),
      "runtime-ip-unproven",
      3,
      60,
    );
    expect((await heartbeatFrom(named.device, named.activationId, nat)).status).toBe(429);
    // ... while a device that never failed there goes on, and the named one from anywhere else.
    expect((await heartbeatFrom(bystander.device, bystander.activationId, nat)).status).toBe(200);
    expect((await heartbeatFrom(named.device, named.activationId, "198.51.100.81")).status).toBe(200);
  });

  test("forged proofs naming one activation slow only that activation, only from the sender's address, and leave its own window alone", async () => {
    t = createTestContext({
      runtimeRateLimits: { ip: { limit: 10, windowSec: 60 }, activation: { limit: 2, windowSec: 60 } },
    });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const victim = await activatedDevice(t, fx);
    const bystander = await activatedDevice(t, fx);
    const attacker = new TestDevice();
    for (let i = 0; i < 2; i++) {
      const forged = await heartbeatFrom(attacker, victim.activationId, "203.0.113.66");
      expect(forged.body.error.code).toBe("DEVICE_PROOF_INVALID");
    }
    const refused = await heartbeatFrom(attacker, victim.activationId, "203.0.113.66");
    expectRateLimited(refused, "runtime-activation-unproven", 2, 60);
    // Documented limit: a sender that knows an activation id can slow that device from its own address.
    expectRateLimited(
      await heartbeatFrom(victim.device, victim.activationId, "203.0.113.66"),
      "runtime-activation-unproven",
      2,
      60,
    );
    expect((await heartbeatFrom(bystander.device, bystander.activationId, "203.0.113.66")).status).toBe(200);
    // Anywhere else the victim has its whole window.
    expect((await heartbeatFrom(victim.device, victim.activationId, "203.0.113.67")).status).toBe(200);
    expect((await heartbeatFrom(victim.device, victim.activationId, "203.0.113.67")).status).toBe(200);
    expectRateLimited(
      await heartbeatFrom(victim.device, victim.activationId, "203.0.113.67"),
      "runtime-activation",
      2,
      60,
    );
  });

  /** Answers by status and, for refusals, by the window that refused them. */
  const tally = (answers: CallResult[]) => {
    const counts: Record<string, number> = {};
    for (const answer of answers) {
      const key = answer.status === 429 ? `429 ${answer.body.error.details.policy}` : String(answer.status);
      counts[key] = (counts[key] ?? 0) + 1;
    }
    return counts;
  };

  test("forged proofs sent at once naming one activation get only its failing-proof window of signature checks: of twenty with a window of two, two are checked and eighteen refused", async () => {
    t = createTestContext({
      runtimeRateLimits: { ip: { limit: 10, windowSec: 60 }, activation: { limit: 2, windowSec: 60 } },
    });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const victim = await activatedDevice(t, fx);
    const attacker = new TestDevice();
    const from = "203.0.113.70";
    const answers = await Promise.all(
      Array.from({ length: 20 }, () => heartbeatFrom(attacker, victim.activationId, from)),
    );
    expect(tally(answers)).toEqual({ "401": 2, "429 runtime-activation-unproven": 18 });
    expectRateLimited(
      answers.find((a) => a.status === 429) as CallResult,
      "runtime-activation-unproven",
      2,
      60,
    );
    // The refusals were not charged: the window refills at one check per 30 s, as after two failures.
    t.clock.advance(30);
    expect((await heartbeatFrom(attacker, victim.activationId, from)).status).toBe(401);
    expect((await heartbeatFrom(attacker, victim.activationId, from)).status).toBe(429);
  });

  test("a captured check-in replayed at once is answered once; the replays get only the failing-proof window of checks", async () => {
    t = createTestContext({
      runtimeRateLimits: { ip: { limit: 10, windowSec: 60 }, activation: { limit: 2, windowSec: 60 } },
    });
    const fx = await runtimeFixture(t);
    const { device, activationId } = await activatedDevice(t, fx);
    const text = JSON.stringify({ machine_info_digest: DIGEST });
    const path = heartbeatPath(activationId);
    const headers = {
      "content-type": "application/json",
      ...device.proofHeaders("POST", path, activationId, text, { timestamp: nowSec(t) }),
    };
    const answers = await Promise.all(
      Array.from({ length: 10 }, () =>
        t.call("POST", path, { key: null, rawBody: text, clientAddress: "203.0.113.71", headers }),
      ),
    );
    expect(tally(answers)).toEqual({ "200": 1, "401": 2, "429 runtime-activation-unproven": 7 });
    for (const replay of answers.filter((a) => a.status === 401))
      expect(replay.body.error.details.reason).toBe("replayed");
  });

  test("failing proofs sent at once from one address get only the address's window: made-up ids and a known activation are checked three times in twenty with a window of three, and a genuine device sent among them goes on", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 3, windowSec: 60 } } });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const known = await activatedLater(fx);
    const genuine = await activatedLater(fx);
    const attacker = new TestDevice();
    const from = "198.51.100.91";
    const madeUp = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        heartbeatFrom(attacker, `act_${String(i).padStart(28, "0")}`, from),
      ),
    );
    expect(tally(madeUp)).toEqual({ "404": 3, "429 runtime-ip-unproven": 17 });

    t.clock.advance(120);
    const [own, ...forged] = await Promise.all([
      heartbeatFrom(genuine.device, genuine.activationId, from),
      ...Array.from({ length: 20 }, () => heartbeatFrom(attacker, known.activationId, from)),
    ]);
    // The first failure marks the activation as failed from here: no more checks once the
    // address's window is used up.
    expect(tally(forged)).toEqual({ "401": 3, "429 runtime-ip-unproven": 17 });
    expect(own?.status).toBe(200);
  });

  test("forged proofs sent at once naming several known activations get at most the address's window plus one check per activation", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 3, windowSec: 60 } } });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const known = [await activatedLater(fx), await activatedLater(fx), await activatedLater(fx)];
    const attacker = new TestDevice();
    const answers = await Promise.all(
      Array.from({ length: 30 }, (_, i) =>
        heartbeatFrom(attacker, known[i % 3]!.activationId, "198.51.100.92"),
      ),
    );
    const checked = answers.filter((a) => a.status === 401).length;
    // Which activations the first three failures named decides how many get one more: 3 to 5.
    expect(checked).toBeGreaterThanOrEqual(3);
    expect(checked).toBeLessThanOrEqual(3 + known.length - 1);
    expect(tally(answers)["429 runtime-ip-unproven"]).toBe(30 - checked);
  });

  test("once an address's failing proofs use up its window, each activation gets at most one failing proof check per window from it", async () => {
    t = createTestContext({ runtimeRateLimits: { ip: { limit: 3, windowSec: 60 } } });
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const from = "198.51.100.90";
    const known = [await activatedLater(fx), await activatedLater(fx), await activatedLater(fx)];
    const genuine = await activatedLater(fx);
    const attacker = new TestDevice();
    const forge = (i: number) => heartbeatFrom(attacker, known[i]!.activationId, from);
    for (let i = 0; i < 3; i++) expect((await forge(0)).body.error.code).toBe("DEVICE_PROOF_INVALID");
    expectRateLimited(await forge(0), "runtime-ip-unproven", 3, 60);
    for (const i of [1, 2]) {
      expect((await forge(i)).body.error.code).toBe("DEVICE_PROOF_INVALID");
      expectRateLimited(await forge(i), "runtime-ip-unproven", 3, 60);
    }
    expect((await heartbeatFrom(genuine.device, genuine.activationId, from)).status).toBe(200);
    // Both windows refill: the address's and the activation's last failure.
    t.clock.advance(120);
    expect((await forge(0)).body.error.code).toBe("DEVICE_PROOF_INVALID");
  });
});
