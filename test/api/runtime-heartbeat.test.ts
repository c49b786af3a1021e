import { Database } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { createApp } from "../../src/app.ts";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { TestDevice } from "../support/device.ts";
import { expectSignedEnvelope, verifiedCertificate } from "../support/envelope.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import {
  activate,
  activatedDevice,
  heartbeatPath,
  nowSec,
  proofCall,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";

let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { license_type: "subscription", heartbeat_sec: 3600, max_machines: 5 },
  });
});
afterEach(() => t.close());

const DIGEST = machineInfoDigest({ os: "linux", arch: "x64" });
const beat = (
  device: TestDevice,
  id: string,
  body: unknown = { machine_info_digest: DIGEST },
  options = {},
) => proofCall(t, device, "POST", heartbeatPath(id), id, body, options);

describe("happy path", () => {
  test.each(["ed25519", "p256"] as const)(
    "an %s device checks in and gets a signed fresh certificate",
    async (alg) => {
      const { device, activationId } = await activatedDevice(t, fx, alg);
      t.clock.freeze();
      t.clock.advance(60);
      const response = await beat(device, activationId);
      expect(response.status).toBe(200);
      expectSignedEnvelope(response.body, {
        status: 200,
        nonce: response.body.response_assertion.nonce,
        productId: fx.productId,
        bundle: fx.bundle,
      });
      expect(response.body.data).toMatchObject({
        activation_id: activationId,
        license_status: "active",
        machine_info_digest: DIGEST,
      });
      expect(response.body.data.next_heartbeat_in).toBeGreaterThanOrEqual(3240);
      expect(response.body.data.next_heartbeat_in).toBeLessThanOrEqual(3960);
      const { claims } = verifiedCertificate(response.body.data.certificate, fx.bundle);
      expect(claims.iat).toBe(nowSec(t));
      expect(claims.cnf.jkt).toBe(device.thumbprint);
    },
  );

  test("the signed nonce is the X-Service-Nonce header of the request", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const nonce = "a-fixed-nonce-of-enough-length-01";
    const response = await beat(device, activationId, undefined, { nonce });
    expectSignedEnvelope(response.body, { status: 200, nonce, productId: fx.productId, bundle: fx.bundle });
  });

  test("a suspended license still checks in, reporting suspended", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body: { status_action: "suspended" } });
    const response = await beat(device, activationId);
    expect(response.status).toBe(200);
    expect(response.body.data.license_status).toBe("suspended");
  });

  test("a suspended license past its expiry gets a certificate that is already over, never one ending before it begins", async () => {
    const expiring = await runtimeFixture(t, {
      policy: { max_machines: 2 },
      license: { expires_at: new Date(t.clock.now().getTime() + 3_600_000).toISOString() },
    });
    const { device, activationId } = await activatedDevice(t, expiring);
    await t.call("PATCH", `/mgmt/v1/licenses/${expiring.licenseId}`, {
      body: { status_action: "suspended" },
    });
    t.clock.advance(7200);
    const response = await beat(device, activationId, { machine_info: { os: "linux", arch: "x64" } });
    expect(response.status).toBe(200);
    expect(response.body.data.license_status).toBe("suspended");
    const { claims } = verifiedCertificate(response.body.data.certificate, expiring.bundle);
    expect(claims.exp).toBe(claims.iat);
  });

  test("heartbeat intervals spread out instead of synchronising the fleet", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const seen = new Set<number>();
    for (let i = 0; i < 20; i++) seen.add((await beat(device, activationId)).body.data.next_heartbeat_in);
    expect(seen.size).toBeGreaterThan(5);
  });
});

describe("policy changes reach the next call", () => {
  const interval = async (device: TestDevice, id: string) =>
    (await beat(device, id)).body.data.next_heartbeat_in as number;

  test("a policy edited through the API sets the interval of the very next heartbeat", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    expect(await interval(device, activationId)).toBeGreaterThanOrEqual(3240);
    const etag = (await t.call("GET", `/mgmt/v1/policies/${fx.policyId}`)).headers.get("etag") ?? "";
    const edit = await t.call("PATCH", `/mgmt/v1/policies/${fx.policyId}`, {
      body: { heartbeat_sec: 600 },
      headers: { "if-match": etag },
    });
    expect(edit.status).toBe(200);
    const next = await interval(device, activationId);
    expect(next).toBeGreaterThanOrEqual(540);
    expect(next).toBeLessThanOrEqual(660);
  });

  test("a policy changed by another process, by plain SQL that leaves the revision alone, is read again", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    expect(await interval(device, activationId)).toBeGreaterThanOrEqual(3240);
    const revisionBefore = t.deps.sqlite
      .query<{ revision: number }, [string]>("SELECT revision FROM policies WHERE id = ?")
      .get(fx.policyId)?.revision;
    const other = new Database(join(t.dir, "licensing.db"));
    try {
      other.query("UPDATE policies SET heartbeat_sec = 900 WHERE id = ?").run(fx.policyId);
    } finally {
      other.close();
    }
    // The store raises the revision itself (migration 0019), and with it the ETag.
    expect(
      t.deps.sqlite
        .query<{ revision: number }, [string]>("SELECT revision FROM policies WHERE id = ?")
        .get(fx.policyId)?.revision,
    ).toBe((revisionBefore ?? 0) + 1);
    const next = await interval(device, activationId);
    expect(next).toBeGreaterThanOrEqual(810);
    expect(next).toBeLessThanOrEqual(990);
  });
});

describe("license state before activation state", () => {
  test("a revoked license answers LICENSE_REVOKED even to a deactivated device, signed", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    await t.call("DELETE", `/mgmt/v1/activations/${activationId}`);
    await t.call("DELETE", `/mgmt/v1/licenses/${fx.licenseId}`);
    const response = await beat(device, activationId);
    expect(response.status).toBe(403);
    expect(response.body.error.code).toBe("LICENSE_REVOKED");
    expectSignedEnvelope(response.body, {
      status: 403,
      nonce: response.body.response_assertion.nonce,
      productId: fx.productId,
      bundle: fx.bundle,
    });
  });

  test("an expired license answers LICENSE_EXPIRED, signed", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    t.clock.advance(400 * 86_400);
    const response = await beat(device, activationId);
    expect(response.body.error.code).toBe("LICENSE_EXPIRED");
    expect(response.body.response_signature).toBeDefined();
  });

  test("a deactivated device answers 410 ACTIVATION_DEACTIVATED, signed", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const gone = await proofCall(
      t,
      device,
      "DELETE",
      `/runtime/v1/activations/${activationId}`,
      activationId,
    );
    expect(gone.status).toBe(200);
    expect(gone.body.data).toBe("deactivated");
    expectSignedEnvelope(gone.body, {
      status: 200,
      nonce: gone.body.response_assertion.nonce,
      productId: fx.productId,
      bundle: fx.bundle,
    });
    const response = await beat(device, activationId);
    expect(response.status).toBe(410);
    expect(response.body.error.code).toBe("ACTIVATION_DEACTIVATED");
    expectSignedEnvelope(response.body, {
      status: 410,
      nonce: response.body.response_assertion.nonce,
      productId: fx.productId,
      bundle: fx.bundle,
    });
    const again = await proofCall(
      t,
      device,
      "DELETE",
      `/runtime/v1/activations/${activationId}`,
      activationId,
    );
    expect(again.status).toBe(410);
  });
});

describe("attacks on the device proof", () => {
  const expectProofRefused = (
    response: { status: number; body: { error: { code: string; details: { reason?: string } } } },
    reason?: string,
  ) => {
    expect(response.status).toBe(401);
    expect(response.body.error.code).toBe("DEVICE_PROOF_INVALID");
    if (reason) expect(response.body.error.details.reason).toBe(reason);
  };

  test("a forged or truncated signature is refused and changes nothing", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const headers = device.proofHeaders("POST", heartbeatPath(activationId), activationId, "{}", {
      timestamp: nowSec(t),
    });
    const forged = new TestDevice().proofHeaders("POST", heartbeatPath(activationId), activationId, "{}", {
      timestamp: nowSec(t),
    });
    for (const signature of [
      forged["x-service-signature"] as string,
      (headers["x-service-signature"] as string).slice(0, 60),
      "!!",
    ]) {
      const response = await beat(device, activationId, undefined, {
        headers: { "x-service-signature": signature },
      });
      expectProofRefused(response);
    }
    const row = t.deps.sqlite
      .query<{ last_heartbeat_at: number | null }, [string]>(
        "SELECT last_heartbeat_at FROM activations WHERE id = ?",
      )
      .get(activationId);
    expect(row?.last_heartbeat_at).toBeNull();
  });

  test("a proof made for another path or another body is refused", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const otherPath = device.proofHeaders(
      "DELETE",
      `/runtime/v1/activations/${activationId}`,
      activationId,
      "",
      { timestamp: nowSec(t) },
    );
    expectProofRefused(
      await beat(device, activationId, undefined, { headers: otherPath }),
      "invalid_signature",
    );
    const body = { machine_info_digest: DIGEST };
    const otherBody = device.proofHeaders(
      "POST",
      heartbeatPath(activationId),
      activationId,
      JSON.stringify({ ...body, app_version: "9" }),
      { timestamp: nowSec(t) },
    );
    expectProofRefused(await beat(device, activationId, body, { headers: otherBody }), "invalid_signature");
  });

  test("a replayed nonce is refused, also after a restart", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const nonce = "replayed-nonce-000000000001";
    expect((await beat(device, activationId, undefined, { nonce })).status).toBe(200);
    expectProofRefused(await beat(device, activationId, undefined, { nonce }), "replayed");
    // A fresh app over the same store: nothing is remembered in memory, the store still refuses.
    const restarted = createApp(t.deps, { baseUrl: BASE_URL });
    const text = JSON.stringify({ machine_info_digest: DIGEST });
    const headers = device.proofHeaders("POST", heartbeatPath(activationId), activationId, text, {
      timestamp: nowSec(t),
      nonce,
    });
    const response = await restarted.handle(
      new Request(`${BASE_URL}${heartbeatPath(activationId)}`, {
        method: "POST",
        body: text,
        headers: { ...headers, "content-type": "application/json" },
      }),
    );
    expect(response.status).toBe(401);
    expect(((await response.json()) as { error: { details: { reason: string } } }).error.details.reason).toBe(
      "replayed",
    );
  });

  test("a request sent twice at once, so both share one commit, is answered once and refused once as a replay", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    t.clock.freeze();
    const nonce = "same-turn-replay-nonce-0001";
    const [first, second] = await Promise.all([
      beat(device, activationId, undefined, { nonce }),
      beat(device, activationId, undefined, { nonce }),
    ]);
    expect([first.status, second.status].sort()).toEqual([200, 401]);
    expectProofRefused(first.status === 401 ? first : second, "replayed");
    const nonces = t.deps.sqlite
      .query<{ n: number }, [string]>("SELECT count(*) AS n FROM device_nonces WHERE nonce = ?")
      .get(nonce)?.n;
    expect(nonces).toBe(1);
  });

  test("a timestamp 301 seconds off answers CLOCK_SKEW with the server time; 300 is accepted", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    t.clock.freeze();
    for (const offset of [301, -301]) {
      const response = await beat(device, activationId, undefined, { timestamp: nowSec(t) + offset });
      expect(response.status).toBe(401);
      expect(response.body.error).toMatchObject({ code: "CLOCK_SKEW", details: { server_time: nowSec(t) } });
    }
    expect((await beat(device, activationId, undefined, { timestamp: nowSec(t) - 300 })).status).toBe(200);
  });

  test("another device cannot use this activation id, and headers must name the path's activation", async () => {
    const { activationId } = await activatedDevice(t, fx);
    const intruder = await activatedDevice(t, fx);
    expectProofRefused(await beat(intruder.device, activationId), "invalid_signature");
    const mismatch = await proofCall(
      t,
      intruder.device,
      "POST",
      heartbeatPath(activationId),
      intruder.activationId,
      { machine_info_digest: DIGEST },
    );
    expectProofRefused(mismatch, "activation_mismatch");
  });

  test("missing or malformed proof headers answer 400", async () => {
    const { activationId } = await activatedDevice(t, fx);
    const response = await t.call("POST", heartbeatPath(activationId), {
      key: null,
      body: { machine_info_digest: DIGEST },
    });
    expect(response.status).toBe(400);
    expect(Object.keys(response.body.error.details.errors)).toEqual(
      expect.arrayContaining([
        "x-service-activation",
        "x-service-timestamp",
        "x-service-nonce",
        "x-service-signature",
      ]),
    );
    const { device } = await activatedDevice(t, fx);
    const shortNonce = await beat(device, activationId, undefined, {
      headers: { "x-service-nonce": "short" },
    });
    expect(shortNonce.status).toBe(400);
  });

  test("an unknown activation answers 404", async () => {
    const device = new TestDevice();
    const id = "act_01M81Z00000000000000000000";
    expect((await beat(device, id)).status).toBe(404);
  });
});

describe("machine info", () => {
  test("a changed digest asks for the full machine_info, which then becomes the baseline", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const moved = { os: "linux", arch: "arm64" };
    const changed = await beat(device, activationId, { machine_info_digest: machineInfoDigest(moved) });
    expect(changed.status).toBe(422);
    expect(changed.body.error).toMatchObject({
      code: "MACHINE_INFO_REQUIRED",
      details: { reason: "digest_changed" },
    });
    const full = await beat(device, activationId, { machine_info: moved });
    expect(full.status).toBe(200);
    expect(full.body.data.machine_info_digest).toBe(machineInfoDigest(moved));
    expect((await beat(device, activationId, { machine_info_digest: machineInfoDigest(moved) })).status).toBe(
      200,
    );
  });

  test("a baseline older than 24 hours asks for the full machine_info again", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    t.clock.advance(24 * 3600 + 1);
    const stale = await beat(device, activationId);
    expect(stale.body.error).toMatchObject({
      code: "MACHINE_INFO_REQUIRED",
      details: { reason: "baseline_stale" },
    });
    expect((await beat(device, activationId, { machine_info: { os: "linux", arch: "x64" } })).status).toBe(
      200,
    );
  });

  test("the relaxed profile accepts a changed digest without the full machine_info", async () => {
    const relaxed = await runtimeFixture(t, { policy: { fingerprint_profile: "relaxed" } });
    const { device, activationId } = await activatedDevice(t, relaxed);
    const response = await beat(device, activationId, { machine_info_digest: "a".repeat(64) });
    expect(response.status).toBe(200);
  });

  test("an unmanaged offline perpetual license takes no heartbeats", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    t.deps.sqlite.run(
      "UPDATE policies SET perpetual_mode = 'unmanaged', license_type = 'perpetual' WHERE id = ?",
      [fx.policyId],
    );
    const response = await beat(device, activationId);
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("OFFLINE_ACTIVATION_REQUIRED");
  });
});

describe("machine slots of heartbeat-required policies", () => {
  test("a device silent past heartbeat + grace frees its slot, and on return finds it taken (410, culled)", async () => {
    const strict = await runtimeFixture(t, {
      policy: { license_type: "subscription", max_machines: 1, heartbeat_sec: 3600, network_grace_sec: 7200 },
    });
    const first = await activatedDevice(t, strict);
    const second = new TestDevice();
    expect((await activate(t, second, strict)).status).toBe(409);
    t.clock.advance(3600 + 7200 + 1);
    expect((await activate(t, second, strict)).status).toBe(201);
    const back = await beat(first.device, first.activationId, { machine_info: { os: "linux", arch: "x64" } });
    expect(back.status).toBe(410);
    expect(back.body.error).toMatchObject({ code: "ACTIVATION_DEACTIVATED", details: { reason: "culled" } });
  });

  test("a stale device activating again on a full license competes as a new device and is refused", async () => {
    const strict = await runtimeFixture(t, {
      policy: { license_type: "subscription", max_machines: 1, heartbeat_sec: 3600, network_grace_sec: 7200 },
    });
    const first = new TestDevice();
    expect((await activate(t, first, strict)).status).toBe(201);
    t.clock.advance(3600 + 7200 + 1);
    expect((await activate(t, new TestDevice(), strict)).status).toBe(201);
    const back = await activate(t, first, strict);
    expect(back.status).toBe(409);
    expect(back.body.error.code).toBe("MACHINE_LIMIT_REACHED");
    // The refusal undid everything the attempt did, the cull of its old activation included: it is
    // still there, to be culled (signed 410) when it next checks in.
    const rows = t.deps.sqlite
      .query<{ status: string }, [string]>("SELECT status FROM activations WHERE device_thumbprint = ?")
      .all(first.thumbprint);
    expect(rows).toEqual([{ status: "active" }]);
  });

  test("a device that checks in keeps its slot however long it runs", async () => {
    const strict = await runtimeFixture(t, {
      policy: { license_type: "subscription", max_machines: 1, heartbeat_sec: 3600, network_grace_sec: 7200 },
    });
    const first = await activatedDevice(t, strict);
    for (let i = 0; i < 5; i++) {
      t.clock.advance(3500);
      expect(
        (await beat(first.device, first.activationId, { machine_info: { os: "linux", arch: "x64" } })).status,
      ).toBe(200);
    }
    expect((await activate(t, new TestDevice(), strict)).status).toBe(409);
  });
});
