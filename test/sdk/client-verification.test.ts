import { describe, expect, test } from "bun:test";
import {
  b64uDecode,
  b64uEncode,
  type FetchLike,
  LicensingClient,
  MemoryStorage,
  type SdkError,
} from "../../src/sdk/index.ts";
import { edKey, type Json, T0 } from "./support/authority.ts";
import { rejectsSdk } from "./support/expect.ts";
import { FakeServer, type SeenRequest } from "./support/fake-server.ts";
import { activated, harness } from "./support/setup.ts";

const isHeartbeat = (req: SeenRequest) => req.path.endsWith("/heartbeat");

/** Everything the client persisted, to prove a refused answer changed nothing. */
async function snapshot(storage: MemoryStorage): Promise<Record<string, string | undefined>> {
  const out: Record<string, string | undefined> = {};
  for (const key of storage.keys()) out[key] = await storage.get(key);
  return out;
}

function truncate(sig: string): string {
  return b64uEncode(b64uDecode(sig).subarray(0, 63));
}

describe("every heartbeat answer passes the full chain before anything is stored", () => {
  const tamperings: [string, string, (env: Json) => void][] = [
    [
      "altered data",
      "BODY_HASH_MISMATCH",
      (e) => {
        (e.data as Json).license_status = "suspended";
      },
    ],
    [
      "an altered signed nonce",
      "RESPONSE_SIGNATURE_INVALID",
      (e) => {
        (e.response_assertion as Json).nonce = "x".repeat(22);
      },
    ],
    [
      "an altered signed status",
      "RESPONSE_SIGNATURE_INVALID",
      (e) => {
        (e.response_assertion as Json).status = 201;
      },
    ],
    [
      "an altered body hash",
      "RESPONSE_SIGNATURE_INVALID",
      (e) => {
        (e.response_assertion as Json).body_sha256 = "0".repeat(64);
      },
    ],
    [
      "an altered delegation expiry",
      "DELEGATION_SIGNATURE_INVALID",
      (e) => {
        ((e.signing_delegation as Json).delegation as Json).expires_at = T0 + 999;
      },
    ],
    [
      "an altered delegated public key",
      "DELEGATION_SIGNATURE_INVALID",
      (e) => {
        ((e.signing_delegation as Json).delegation as Json).public_key = edKey().publicKey;
      },
    ],
    [
      "a truncated response signature",
      "RESPONSE_SIGNATURE_INVALID",
      (e) => {
        e.response_signature = truncate(e.response_signature as string);
      },
    ],
    [
      "a truncated delegation signature",
      "DELEGATION_SIGNATURE_INVALID",
      (e) => {
        const sd = e.signing_delegation as Json;
        sd.signature = truncate(sd.signature as string);
      },
    ],
    [
      "a forged response signature",
      "RESPONSE_SIGNATURE_INVALID",
      (e) => {
        e.response_signature = b64uEncode(new Uint8Array(64).fill(1));
      },
    ],
    [
      "removed signature fields",
      "RESPONSE_UNSIGNED",
      (e) => {
        delete e.response_assertion;
        delete e.response_signature;
        delete e.signing_delegation;
      },
    ],
  ];
  for (const [what, code, change] of tamperings) {
    test(`a heartbeat answer with ${what} is refused with ${code}`, async () => {
      const h = await activated();
      const before = await snapshot(h.storage);
      h.server.mutate = (env, req) => {
        if (isHeartbeat(req)) change(env);
        return env;
      };
      h.server.serverTime = T0 + 100;
      const e = await rejectsSdk(h.client.heartbeat());
      expect(e.code).toBe(code);
      expect(e.kind).toBe("verification");
      expect(await snapshot(h.storage)).toEqual(before);
    });
  }

  const dishonest: [string, string, (req: SeenRequest) => Json][] = [
    ["signed for another request's nonce", "NONCE_MISMATCH", () => ({ nonce: "an-old-nonce-replayed-here" })],
    ["signed with another status", "STATUS_MISMATCH", () => ({ status: 201 })],
    ["signed for another product", "PRODUCT_MISMATCH", () => ({ assertion: { product_id: "prod_other" } })],
    [
      "signed with a wrong body hash",
      "BODY_HASH_MISMATCH",
      () => ({ assertion: { body_sha256: "1".repeat(64) } }),
    ],
    ["signed with an expired delegation", "DELEGATION_EXPIRED", () => ({ serverTime: T0 + 30 * 86_400 })],
    [
      "signed under a delegation longer than 7 days",
      "DELEGATION_INVALID",
      () => ({ delegation: { expires_at: T0 + 8 * 86_400 } }),
    ],
    [
      "signed by a key other than the delegated one",
      "RESPONSE_SIGNATURE_INVALID",
      () => ({ responseSigner: edKey() }),
    ],
    ["naming another online key", "ONLINE_KEY_MISMATCH", () => ({ assertion: { key_id: edKey().keyId } })],
  ];
  for (const [what, code, options] of dishonest) {
    test(`a heartbeat answer ${what} is refused with ${code}`, async () => {
      const h = await activated();
      const before = await snapshot(h.storage);
      h.server.sign = (req) => (isHeartbeat(req) ? options(req) : {});
      const e = await rejectsSdk(h.client.heartbeat());
      expect(e.code).toBe(code);
      expect(await snapshot(h.storage)).toEqual(before);
    });
  }

  test("a heartbeat certificate issued for another device is refused", async () => {
    const h = await activated();
    const before = await snapshot(h.storage);
    h.server.certificateClaims = { cnf: { jkt: "e".repeat(64) } };
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("CERTIFICATE_DEVICE_MISMATCH");
    expect(await snapshot(h.storage)).toEqual(before);
  });

  test("a heartbeat certificate for another license is refused", async () => {
    const h = await activated();
    h.server.certificateClaims = { sub: "lic_other" };
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("CERTIFICATE_MISMATCH");
  });
});

describe("trust bundle handling in the client", () => {
  test("a bundle with a lower sequence than the one this device holds is refused as a rollback", async () => {
    const h = await activated();
    h.server.authority.sequence = 7;
    h.clock.ms += 2 * 3600_000;
    h.server.serverTime += 7200;
    await h.client.heartbeat();
    h.server.authority.sequence = 6;
    const restarted = h.restart();
    h.clock.ms += 2 * 3600_000;
    h.server.serverTime += 7200;
    const e = await rejectsSdk(restarted.heartbeat());
    expect(e.code).toBe("BUNDLE_SEQUENCE_ROLLBACK");
    expect(e.details).toMatchObject({ sequence: 6, minimum: 7 });
  });

  test("two refreshes in flight, the newer bundle answered first, leave the newer one stored and held", async () => {
    const server = new FakeServer();
    let fetched = 0;
    server.bundleData = () =>
      server.authority.signedBundle({ overrides: { sequence: ++fetched === 1 ? 3 : 4 } });
    const slowStorage = new (class extends MemoryStorage {
      override async set(key: string, value: string) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        return super.set(key, value);
      }
    })();
    // The first request (sequence 3) is answered after the second (sequence 4).
    let bundleRequests = 0;
    const fetch: FetchLike = async (url, init) => {
      const first = url.includes("trust-bundle") && ++bundleRequests === 1;
      const answer = await server.fetch(url, init);
      if (first) await new Promise((resolve) => setTimeout(resolve, 10));
      return answer;
    };
    const client = () =>
      new LicensingClient({
        config: server.authority.config(),
        fetch,
        storage: slowStorage,
        now: () => T0 * 1000,
      });
    const first = client();
    await Promise.all([
      first.trustBundle(),
      new Promise((resolve) => setTimeout(resolve, 1)).then(() => first.trustBundle()),
    ]);
    expect((await first.trustBundle()).sequence).toBe(4);
    const offline = new LicensingClient({
      config: server.authority.config(),
      fetch: async () => {
        throw new TypeError("offline");
      },
      storage: slowStorage,
      now: () => T0 * 1000,
    });
    expect((await offline.trustBundle()).sequence).toBe(4);
  });

  test("a cached bundle is reused while fresh and refetched once it is older than the maximum age", async () => {
    const h = await activated();
    const gets = () => h.server.requests.filter((r) => r.method === "GET").length;
    await h.client.heartbeat();
    expect(gets()).toBe(1);
    h.clock.ms += 3600_001;
    h.server.serverTime += 3601;
    await h.client.heartbeat();
    expect(gets()).toBe(2);
  });

  test("a response from a signing key missing in the cached bundle triggers one refetch", async () => {
    const h = await activated();
    const rotated = { ...edKey(), status: "active" as const, not_before: T0 - 86_400, not_after: null };
    h.server.authority.signing.unshift(rotated);
    h.server.authority.sequence = 4;
    await h.client.heartbeat();
    expect(h.server.requests.filter((r) => r.method === "GET").length).toBe(2);
    expect((await h.client.trustBundle()).sequence).toBe(4);
  });

  test("a response delegated by a key the fresh bundle marks compromised is refused", async () => {
    const h = await activated();
    h.server.authority.signing[0]!.status = "compromised";
    h.server.authority.sequence = 4;
    h.clock.ms += 3600_001;
    h.server.serverTime += 3601;
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("KEY_COMPROMISED");
  });

  test("a bundle signed by another root is refused before any response is believed", async () => {
    const h = harness();
    h.server.bundleData = () => h.server.authority.signedBundle({ signer: edKey() });
    expect((await rejectsSdk(h.client.serverTime())).code).toBe("BUNDLE_SIGNATURE_INVALID");
    expect(await h.storage.get(`svc.v1.live.${h.server.authority.productId}.bundle`)).toBeUndefined();
  });

  test("a tampered bundle in storage is not trusted and is fetched again", async () => {
    const h = await activated();
    const key = `svc.v1.live.${h.server.authority.productId}.bundle`;
    const stored = JSON.parse((await h.storage.get(key))!);
    stored.signed.bundle.signing_keys[0].status = "active";
    stored.signed.bundle.issued_at += 1;
    await h.storage.set(key, JSON.stringify(stored));
    const restarted = h.restart();
    await restarted.heartbeat();
    expect(h.server.requests.filter((r) => r.method === "GET").length).toBe(2);
  });
});

describe("license-state denials and unsigned errors", () => {
  test("an authentic LICENSE_REVOKED makes the license invalid at once", async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      isHeartbeat(req) ? h.server.denial(req, 403, "LICENSE_REVOKED") : undefined,
    );
    const e = await rejectsSdk(h.client.heartbeat());
    expect(e).toMatchObject({ code: "LICENSE_REVOKED", kind: "license", status: 403, authentic: true });
    expect(e.serverError?.code).toBe("LICENSE_REVOKED");
    expect(await h.client.licenseInfo()).toMatchObject({ state: "invalid", reason: "revoked" });
  });

  test("an unsigned LICENSE_REVOKED is never taken as license state", async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      isHeartbeat(req) ? FakeServer.error(403, "LICENSE_REVOKED") : undefined,
    );
    const e = await rejectsSdk(h.client.heartbeat());
    expect(e.code).toBe("RESPONSE_UNSIGNED");
    expect(e.details.server_code).toBe("LICENSE_REVOKED");
    expect(await h.client.licenseState()).toBe("valid");
  });

  test("a signed denial whose error object was altered is refused and changes nothing", async () => {
    const h = await activated();
    h.server.handlers.push((req) => {
      if (!isHeartbeat(req)) return undefined;
      const res = h.server.denial(req, 403, "LICENSE_SUSPENDED");
      ((res.body as Json).error as Json).code = "LICENSE_REVOKED";
      return res;
    });
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("BODY_HASH_MISMATCH");
    expect(await h.client.licenseState()).toBe("valid");
  });

  test("a signed denial replayed from another request is refused", async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      isHeartbeat(req)
        ? h.server.denial({ ...req, headers: { "x-service-nonce": "n".repeat(22) } }, 403, "LICENSE_REVOKED")
        : undefined,
    );
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("NONCE_MISMATCH");
    expect(await h.client.licenseState()).toBe("valid");
  });

  test("an authentic ACTIVATION_DEACTIVATED on a heartbeat forgets the activation", async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      isHeartbeat(req) ? h.server.denial(req, 410, "ACTIVATION_DEACTIVATED") : undefined,
    );
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("ACTIVATION_DEACTIVATED");
    expect(await h.client.activationId()).toBeUndefined();
    expect((await h.client.licenseInfo()).reason).toBe("deactivated");
  });

  for (const [status, code] of [
    [403, "LICENSE_REVOKED"],
    [403, "LICENSE_SUSPENDED"],
    [410, "ACTIVATION_DEACTIVATED"],
    [403, "NAMED_USER_ASSIGNMENT_UNAVAILABLE"],
  ] as const) {
    test(`an authentic ${code} naming another activation is refused and changes nothing`, async () => {
      const h = await activated();
      const own = await h.client.activationId();
      h.server.handlers.push((req) =>
        isHeartbeat(req)
          ? h.server.denial(req, status, code, { activation_id: "act_someone_else" })
          : undefined,
      );
      const e = await rejectsSdk(h.client.heartbeat());
      expect(e).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification", authentic: false });
      expect(e.details).toMatchObject({ server_code: code, received: "act_someone_else" });
      expect(await h.client.activationId()).toBe(own);
      expect(await h.client.licenseInfo()).toMatchObject({ state: "valid" });
    });
  }

  test("an authentic denial that names no activation is refused and changes nothing", async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      isHeartbeat(req) ? h.server.denial(req, 410, "ACTIVATION_DEACTIVATED", {}) : undefined,
    );
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("ACTIVATION_MISMATCH");
    expect(await h.client.activationId()).toBeDefined();
    expect(await h.client.licenseState()).toBe("valid");
  });

  test("a later verified heartbeat clears an earlier suspension", async () => {
    const h = await activated();
    h.server.handlers = [
      (req) => (isHeartbeat(req) ? h.server.denial(req, 403, "LICENSE_SUSPENDED") : undefined),
    ];
    await rejectsSdk(h.client.heartbeat());
    expect((await h.client.licenseInfo()).reason).toBe("suspended");
    h.server.handlers = [];
    h.server.sign = () => ({ serverTime: T0 + 1 });
    await h.client.heartbeat();
    expect(await h.client.licenseState()).toBe("valid");
  });

  test("a heartbeat signed in the same second as a suspension does not lift it: which came first cannot be told", async () => {
    const h = await activated();
    h.server.handlers = [
      (req) => (isHeartbeat(req) ? h.server.denial(req, 403, "LICENSE_SUSPENDED") : undefined),
    ];
    await rejectsSdk(h.client.heartbeat());
    h.server.handlers = [];
    const before = await snapshot(h.storage);
    // Both answers carry T0: the success is overtaken by the denial and nothing of it is kept, so
    // the app does not hear "active" from a heartbeat while the license reads suspended.
    const e = await rejectsSdk(h.client.heartbeat());
    // As the denial was received: its status, the server's envelope and its signed details.
    expect(e).toMatchObject({ code: "LICENSE_SUSPENDED", kind: "license", authentic: true, status: 403 });
    expect(e.serverError).toMatchObject({ code: "LICENSE_SUSPENDED", request_id: "req_denial" });
    expect(e.details).toMatchObject({
      activation_id: await h.client.activationId(),
      server_time: T0,
      overtaken_server_time: T0,
    });
    expect(await snapshot(h.storage)).toEqual(before);
    expect(await h.client.licenseInfo()).toMatchObject({ state: "invalid", reason: "suspended" });
  });

  test("the heartbeat loop keeps trying while a same-second suspension stands, and a later answer lifts it", async () => {
    const h = await activated();
    h.server.handlers = [
      (req) => (isHeartbeat(req) ? h.server.denial(req, 403, "LICENSE_SUSPENDED") : undefined),
    ];
    await rejectsSdk(h.client.heartbeat());
    h.server.handlers = [];
    const beats: string[] = [];
    const errors: string[] = [];
    await h.client.startHeartbeatLoop({
      onHeartbeat: (r) => beats.push(r.licenseStatus),
      onError: (error) => errors.push((error as SdkError).code),
    });
    await h.timer.runNext();
    // The loop heard the standing suspension, not "active", and did not stop for it.
    expect(beats).toEqual([]);
    expect(errors).toEqual(["LICENSE_SUSPENDED"]);
    h.server.sign = () => ({ serverTime: T0 + 1 });
    await h.timer.runNext();
    expect(beats).toEqual(["active"]);
    expect(await h.client.licenseState()).toBe("valid");
    h.client.stop();
  });

  test("an unsigned error is surfaced with the server's whole error envelope", async () => {
    const h = await activated();
    h.server.handlers.push((req) =>
      isHeartbeat(req)
        ? FakeServer.error(401, "DEVICE_PROOF_INVALID", {
            request_id: "req_42",
            details: { reason: "replayed" },
          })
        : undefined,
    );
    const e = await rejectsSdk(h.client.heartbeat());
    expect(e).toMatchObject({
      code: "DEVICE_PROOF_INVALID",
      kind: "server",
      status: 401,
      requestId: "req_42",
      retryable: false,
    });
    expect(e.serverError).toEqual({
      code: "DEVICE_PROOF_INVALID",
      message: "device_proof_invalid",
      request_id: "req_42",
      retryable: false,
      doc_url: "https://licensing.example.test/docs/errors#DEVICE_PROOF_INVALID",
      details: { reason: "replayed" },
    });
  });

  test("429 and 503 carry the parsed Retry-After and are retryable", async () => {
    const h = await activated();
    h.server.handlers = [
      (req) =>
        isHeartbeat(req) ? FakeServer.error(429, "RATE_LIMITED", {}, { "retry-after": "17" }) : undefined,
    ];
    expect(await rejectsSdk(h.client.heartbeat())).toMatchObject({
      code: "RATE_LIMITED",
      retryAfterMs: 17_000,
      retryable: true,
    });
    const date = new Date(h.clock.ms + 42_000).toUTCString();
    h.server.handlers = [
      (req) =>
        isHeartbeat(req) ? { status: 503, body: "<html>", headers: { "retry-after": date } } : undefined,
    ];
    expect(await rejectsSdk(h.client.heartbeat())).toMatchObject({
      code: "HTTP_ERROR",
      status: 503,
      retryAfterMs: 42_000,
      retryable: true,
    });
  });

  test("a failed fetch is a retryable NETWORK_ERROR and a non-JSON success is refused", async () => {
    const h = await activated();
    const failing = h.restart({
      fetch: async () => {
        throw new TypeError("offline");
      },
    });
    expect(await rejectsSdk(failing.heartbeat())).toMatchObject({
      code: "NETWORK_ERROR",
      kind: "network",
      retryable: true,
    });
    h.server.handlers.push((req) => (isHeartbeat(req) ? { status: 200, body: undefined } : undefined));
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("RESPONSE_INVALID");
  });

  test("storage and device keys persist across client instances and work offline", async () => {
    const h = await activated();
    const offline = new LicensingClient({
      config: h.server.authority.config(),
      storage: h.storage,
      now: () => h.clock.ms,
      fetch: async () => {
        throw new TypeError("offline");
      },
    });
    expect(await offline.activationId()).toBe((await h.client.activationId())!);
    expect((await offline.deviceKeys()).signing.publicKey).toBe(
      (await h.client.deviceKeys()).signing.publicKey,
    );
    expect(await offline.licenseState()).toBe("valid");
    expect(await offline.hasEntitlement("pro")).toBe(true);
    expect(await offline.hasEntitlement("seats")).toBe(false);
  });
});
