import { describe, expect, test } from "bun:test";
import { T0 } from "./support/authority.ts";
import { rejectsSdk } from "./support/expect.ts";
import { FakeServer } from "./support/fake-server.ts";
import { nodeSha256Hex } from "./support/node-crypto.ts";
import { activated, harness, MACHINE } from "./support/setup.ts";

describe("heartbeat", () => {
  for (const alg of ["ed25519", "p256"] as const) {
    test(`a heartbeat signed with a ${alg} device key is accepted and refreshes the certificate`, async () => {
      const h = await activated({ signingAlgorithm: alg });
      h.server.serverTime = T0 + 600;
      h.clock.ms += 600_000;
      const result = await h.client.heartbeat();
      expect(h.server.proofFailures).toEqual([]);
      expect(result.licenseStatus).toBe("active");
      expect(result.nextHeartbeatIn).toBe(900);
      expect(result.certificate.exp).toBe(T0 + 600 + 86_400);
      expect(result.serverTime).toBe(T0 + 600);
      const info = await h.client.licenseInfo();
      expect(info.expiresAt).toBe(T0 + 600 + 86_400);
    });
  }

  test("a heartbeat sends the machine_info digest, versions and the four device-proof headers", async () => {
    const h = await activated();
    await h.client.heartbeat();
    const req = h.server.requests.at(-1)!;
    const id = await h.client.activationId();
    expect(req.path).toBe(`/runtime/v1/activations/${id}/heartbeat`);
    expect(req.json).toEqual({
      machine_info_digest: nodeSha256Hex('{"arch":"x64","hostname":"build-7","os":"linux"}'),
      app_version: "2.0.0",
      sdk_version: "0.1.0",
    });
    expect(req.headers["x-service-activation"]).toBe(id!);
    expect(req.headers["x-service-timestamp"]).toBe(String(T0));
    expect(req.headers["x-service-nonce"]).toMatch(/^[A-Za-z0-9_-]{22}$/);
    expect(req.headers["x-service-signature"]).toMatch(/^[A-Za-z0-9_-]{86}$/);
  });

  test("MACHINE_INFO_REQUIRED makes the SDK retry once with the full machine_info", async () => {
    const h = await activated();
    let refusals = 0;
    h.server.handlers.push((req) => {
      if (req.path.endsWith("/heartbeat") && req.json?.machine_info === undefined) {
        refusals++;
        return FakeServer.error(422, "MACHINE_INFO_REQUIRED");
      }
      return undefined;
    });
    const result = await h.client.heartbeat();
    expect(refusals).toBe(1);
    const bodies = h.server.requests.filter((r) => r.path.endsWith("/heartbeat")).map((r) => r.json);
    expect(bodies[1]).toEqual({ machine_info: MACHINE, app_version: "2.0.0", sdk_version: "0.1.0" });
    expect(bodies[0]!.nonce).toBeUndefined();
    const nonces = h.server.requests
      .filter((r) => r.path.endsWith("/heartbeat"))
      .map((r) => r.headers["x-service-nonce"]);
    expect(new Set(nonces).size).toBe(2);
    expect(result.machineInfoDigest).toBe(nodeSha256Hex('{"arch":"x64","hostname":"build-7","os":"linux"}'));
  });

  test("a second MACHINE_INFO_REQUIRED is surfaced instead of looping", async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      req.path.endsWith("/heartbeat") ? FakeServer.error(422, "MACHINE_INFO_REQUIRED") : undefined,
    );
    const e = await rejectsSdk(h.client.heartbeat());
    expect(e.code).toBe("MACHINE_INFO_REQUIRED");
    expect(h.server.requests.filter((r) => r.path.endsWith("/heartbeat")).length).toBe(2);
  });

  test("a changed machine description is sent in full and becomes the new baseline", async () => {
    const h = await activated();
    const changed = { os: "linux", arch: "arm64" };
    const result = await h.client.heartbeat({ machineInfo: changed });
    expect(result.machineInfoDigest).toBe(nodeSha256Hex('{"arch":"arm64","os":"linux"}'));
    await h.client.heartbeat();
    expect(h.server.requests.at(-1)!.json!.machine_info_digest).toBe(result.machineInfoDigest);
  });

  test("a heartbeat answer naming another activation is refused", async () => {
    const h = await activated();
    h.server.handlers.push((req) => {
      if (!req.path.endsWith("/heartbeat")) return undefined;
      const data = {
        activation_id: "act_other",
        license_status: "active",
        certificate: "x.y.z",
        next_heartbeat_in: 60,
        machine_info_digest: req.json!.machine_info_digest,
      };
      return h.server.signed(req, data, 200, h.server.nonceOf(req));
    });
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("ACTIVATION_MISMATCH");
  });

  test("a heartbeat before activation fails with NOT_ACTIVATED and sends nothing", async () => {
    const h = harness();
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("NOT_ACTIVATED");
    expect(h.server.requests).toEqual([]);
  });

  test("a heartbeat refused for clock skew is re-signed with the server's time and succeeds", async () => {
    const h = await activated();
    h.clock.ms += 2 * 3600_000;
    h.server.handlers.push((req) => {
      if (!req.path.endsWith("/heartbeat")) return undefined;
      const skew = Math.abs(Number(req.headers["x-service-timestamp"]) - h.server.serverTime);
      return skew > 300
        ? FakeServer.error(401, "CLOCK_SKEW", { details: { server_time: h.server.serverTime } })
        : undefined;
    });
    await h.client.heartbeat();
    const stamps = h.server.requests
      .filter((r) => r.path.endsWith("/heartbeat"))
      .map((r) => r.headers["x-service-timestamp"]);
    expect(stamps).toEqual([String(T0 + 7200), String(T0)]);
    expect(h.server.proofFailures).toEqual([]);
  });
});

describe("deactivation", () => {
  test("deactivation is a signed DELETE without body and forgets the activation but keeps the keys", async () => {
    const h = await activated();
    const keys = await h.client.deviceKeys();
    await h.client.deactivate();
    const req = h.server.requests.at(-1)!;
    expect(req.method).toBe("DELETE");
    expect(req.body).toBeUndefined();
    expect(h.server.proofFailures).toEqual([]);
    expect(await h.client.activationId()).toBeUndefined();
    expect((await h.client.licenseInfo()).reason).toBe("not_activated");
    expect((await h.client.deviceKeys()).signing.publicKey).toBe(keys.signing.publicKey);
  });

  test('a deactivation answer other than the signed string "deactivated" is refused', async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      req.method === "DELETE" ? h.server.signed(req, "active", 200, h.server.nonceOf(req)) : undefined,
    );
    expect((await rejectsSdk(h.client.deactivate())).code).toBe("RESPONSE_INVALID");
    expect(await h.client.activationId()).toBeDefined();
  });

  test("an authentic ACTIVATION_DEACTIVATED answer to a deactivation counts as done", async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      req.method === "DELETE" ? h.server.denial(req, 410, "ACTIVATION_DEACTIVATED") : undefined,
    );
    await h.client.deactivate();
    expect(await h.client.activationId()).toBeUndefined();
  });
});

describe("floating leases", () => {
  test("a lease is acquired, renewed and released with device-proof requests", async () => {
    const h = await activated();
    const id = (await h.client.activationId())!;
    const lease = await h.client.acquireLease("inst-1");
    expect(lease).toMatchObject({ instanceId: "inst-1", expiresAt: T0 + 300, heartbeatIn: 60 });
    expect(h.server.requests.at(-1)!.json).toEqual({ activation_id: id, instance_id: "inst-1" });
    const renewed = await h.client.heartbeatLease(lease.leaseId, "inst-1");
    expect(renewed.leaseId).toBe(lease.leaseId);
    expect(h.server.requests.at(-1)!.path).toBe(`/runtime/v1/leases/${lease.leaseId}/heartbeat`);
    expect(await h.client.releaseLease(lease.leaseId, "inst-1")).toEqual({
      leaseId: lease.leaseId,
      status: "released",
    });
    const release = h.server.requests.at(-1)!;
    expect(release.method).toBe("DELETE");
    expect(release.json).toEqual({ instance_id: "inst-1" });
    expect(h.server.proofFailures).toEqual([]);
  });

  test("a full pool surfaces CONCURRENCY_LIMIT_REACHED as a retryable server error with its envelope", async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      req.path === "/runtime/v1/leases"
        ? FakeServer.error(409, "CONCURRENCY_LIMIT_REACHED", {
            retryable: true,
            details: { max_concurrent: 2 },
          })
        : undefined,
    );
    const e = await rejectsSdk(h.client.acquireLease("inst-1"));
    expect(e.code).toBe("CONCURRENCY_LIMIT_REACHED");
    expect(e.kind).toBe("server");
    expect(e.retryable).toBe(true);
    expect(e.status).toBe(409);
    expect(e.requestId).toBe("req_err");
    expect(e.serverError).toMatchObject({
      code: "CONCURRENCY_LIMIT_REACHED",
      retryable: true,
      details: { max_concurrent: 2 },
    });
  });

  test("a lease answer for another instance or another lease is refused", async () => {
    const h = await activated();
    const activation_id = await h.client.activationId();
    h.server.handlers.push((req) =>
      req.path === "/runtime/v1/leases"
        ? h.server.signed(
            req,
            { lease_id: "lse_1", activation_id, instance_id: "inst-2", expires_at: T0, heartbeat_in: 60 },
            201,
            h.server.nonceOf(req),
          )
        : undefined,
    );
    expect((await rejectsSdk(h.client.acquireLease("inst-1"))).code).toBe("LEASE_MISMATCH");
    h.server.handlers = [
      (req) =>
        req.path.endsWith("/heartbeat") && req.path.includes("leases")
          ? h.server.signed(
              req,
              { lease_id: "lse_9", activation_id, instance_id: "inst-1", expires_at: T0, heartbeat_in: 60 },
              200,
              h.server.nonceOf(req),
            )
          : undefined,
    ];
    expect((await rejectsSdk(h.client.heartbeatLease("lse_1", "inst-1"))).code).toBe("LEASE_MISMATCH");
  });

  test("a lease answer that names another activation is refused with ACTIVATION_MISMATCH", async () => {
    const h = await activated();
    h.server.handlers = [
      (req) =>
        req.path === "/runtime/v1/leases"
          ? h.server.signed(
              req,
              {
                lease_id: "lse_1",
                activation_id: "act_someone_else",
                instance_id: "inst-1",
                expires_at: T0,
                heartbeat_in: 60,
              },
              201,
              h.server.nonceOf(req),
            )
          : undefined,
    ];
    const refused = await rejectsSdk(h.client.acquireLease("inst-1"));
    expect(refused).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification" });
    // A release answer is held to the same: another activation's "released" is not this lease's.
    h.server.handlers = [
      (req) =>
        req.method === "DELETE" && req.path.startsWith("/runtime/v1/leases/")
          ? h.server.signed(
              req,
              { lease_id: "lse_1", activation_id: "act_someone_else", status: "released" },
              200,
              h.server.nonceOf(req),
            )
          : undefined,
    ];
    const release = await rejectsSdk(h.client.releaseLease("lse_1", "inst-1"));
    expect(release).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification" });
  });

  test("a lease answer that names no activation (a server older than the SDK) is refused with RESPONSE_INVALID saying the server must be upgraded", async () => {
    const h = await activated();
    // The shapes a server sent before lease answers named their activation.
    h.server.handlers = [
      (req) =>
        req.path === "/runtime/v1/leases"
          ? h.server.signed(
              req,
              { lease_id: "lse_1", instance_id: "inst-1", expires_at: T0, heartbeat_in: 60 },
              201,
              h.server.nonceOf(req),
            )
          : req.method === "DELETE" && req.path === "/runtime/v1/leases/lse_1"
            ? h.server.signed(req, { lease_id: "lse_1", status: "released" }, 200, h.server.nonceOf(req))
            : undefined,
    ];
    for (const call of [
      () => h.client.acquireLease("inst-1"),
      () => h.client.releaseLease("lse_1", "inst-1"),
    ]) {
      const refused = await rejectsSdk(call());
      expect(refused).toMatchObject({
        code: "RESPONSE_INVALID",
        kind: "verification",
        details: { field: "activation_id", server_upgrade_required: true },
      });
      expect(refused.message).toContain("server is older than this SDK and must be upgraded");
    }
  });
});

describe("signed server time", () => {
  test("the server time is returned in seconds and as the signed ISO string", async () => {
    const h = harness();
    h.server.serverTime = T0 + 5;
    expect(await h.client.serverTime()).toEqual({ serverTime: T0 + 5, iso: "2027-01-15T08:00:05Z" });
    const req = h.server.requests.find((r) => r.path === "/runtime/v1/time")!;
    expect(Object.keys(req.json!).sort()).toEqual(["nonce", "product_id", "sdk_version"]);
  });

  test("a time string that differs from the signed server_time is refused", async () => {
    const h = harness();
    h.server.handlers.push((req) =>
      req.path === "/runtime/v1/time"
        ? h.server.signed(req, "2027-01-15T08:00:01Z", 200, req.json!.nonce as string)
        : undefined,
    );
    expect((await rejectsSdk(h.client.serverTime())).code).toBe("TIME_MISMATCH");
  });

  test("a time that is not whole-second ISO 8601 UTC is refused", async () => {
    const h = harness();
    for (const bad of [
      "2027-01-15T08:00:00.000Z",
      "2027-01-15 08:00:00Z",
      "2027-02-30T08:00:00Z",
      String(T0),
    ]) {
      h.server.handlers = [
        (req) =>
          req.path === "/runtime/v1/time"
            ? h.server.signed(req, bad, 200, req.json!.nonce as string)
            : undefined,
      ];
      expect((await rejectsSdk(h.client.serverTime())).code).toBe("RESPONSE_INVALID");
    }
  });
});
