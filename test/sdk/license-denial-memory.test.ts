import { describe, expect, test } from "bun:test";
import type { SdkError } from "../../src/sdk/index.ts";
import { T0 } from "./support/authority.ts";
import { rejectsSdk } from "./support/expect.ts";
import { FakeServer } from "./support/fake-server.ts";
import { activated, harness, MACHINE } from "./support/setup.ts";

/**
 * What the client remembers by license (`license_denials`), beyond the denials of an activation
 * it holds: a license state a heartbeat reports in a signed 200, and a license-state denial of an
 * activation request, by the license its signed details name. Only what the service signed, for
 * this device, and names a license state is remembered.
 */
const PREFIX = "svc.v1.live.prod_01JTESTPRODUCT0000000000000.";
const LICENSE_ID = "lic_01JTESTLICENSE00000000000000";
const LICENSE = { licenseKey: "LK-1234", machineInfo: MACHINE };

async function remembered(h: { storage: { get(key: string): Promise<string | undefined> } }) {
  const text = await h.storage.get(`${PREFIX}license_denials`);
  const entries = text === undefined ? [] : (JSON.parse(text).entries as Record<string, unknown>[]);
  return entries.map((entry) => ({
    license_id: entry.license_id,
    code: (entry.denial as { code: string }).code,
    server_time: (entry.denial as { server_time: number }).server_time,
  }));
}

describe("a license state a heartbeat reports", () => {
  test("a suspended license_status is remembered as LICENSE_SUSPENDED at the answer's second", async () => {
    const h = await activated();
    h.server.serverTime = T0 + 100;
    h.server.licenseStatus = "suspended";
    expect((await h.client.heartbeat()).licenseStatus).toBe("suspended");
    expect(await remembered(h)).toEqual([
      { license_id: LICENSE_ID, code: "LICENSE_SUSPENDED", server_time: T0 + 100 },
    ]);
  });

  test("a certificate whose license status says revoked is remembered as LICENSE_REVOKED, whatever license_status says", async () => {
    const h = await activated();
    h.server.certificateClaims = {
      license: {
        status: "revoked",
        type: "subscription",
        expires_at: null,
        entitlements: {},
        policy_id: "pol_01JTESTPOLICY000000000000000",
        max_concurrent: null,
      },
    };
    await h.client.heartbeat();
    expect(await remembered(h)).toEqual([
      { license_id: LICENSE_ID, code: "LICENSE_REVOKED", server_time: T0 },
    ]);
  });

  test("an active status, or one that names no license state, is not remembered", async () => {
    const h = await activated();
    for (const status of ["active", "", "constructor", "__proto__", "toString", "SUSPENDED"]) {
      h.server.licenseStatus = status;
      await h.client.heartbeat();
    }
    expect(await remembered(h)).toEqual([]);
  });

  test("a suspension reported by a heartbeat signed before a revocation the device remembers does not replace it", async () => {
    const h = await activated();
    h.server.serverTime = T0 + 50;
    h.server.handlers.push((req) =>
      req.path === "/runtime/v1/leases" ? h.server.denial(req, 403, "LICENSE_REVOKED") : undefined,
    );
    await rejectsSdk(h.client.acquireLease("i-1"));
    h.server.serverTime = T0 + 40;
    h.server.licenseStatus = "suspended";
    expect((await rejectsSdk(h.client.heartbeat())).code).toBe("LICENSE_REVOKED");
    // One entry per license, the latest signed: the later revocation stays.
    expect(await remembered(h)).toEqual([
      { license_id: LICENSE_ID, code: "LICENSE_REVOKED", server_time: T0 + 50 },
    ]);
  });
});

describe("a license-state denial answered to activate()", () => {
  const refuseActivation = (
    h: { server: FakeServer },
    answer: (req: Parameters<FakeServer["denial"]>[0]) => ReturnType<FakeServer["denial"]>,
  ) => h.server.handlers.push((req) => (req.path === "/runtime/v1/activations" ? answer(req) : undefined));

  test("is remembered by the license its signed details name", async () => {
    const h = harness();
    refuseActivation(h, (req) =>
      h.server.denial(req, 403, "LICENSE_EXPIRED", { ...FakeServer.subjectOf(req), license_id: "lic_other" }),
    );
    expect((await rejectsSdk(h.client.activate(LICENSE))).code).toBe("LICENSE_EXPIRED");
    expect(await remembered(h)).toEqual([
      { license_id: "lic_other", code: "LICENSE_EXPIRED", server_time: T0 },
    ]);
    expect(await h.client.activationId()).toBeUndefined();
  });

  test("naming no license, or not as a non-empty string, is not remembered and still fails as the denial", async () => {
    const h = harness();
    for (const licenseId of [undefined, "", 7, null, ["lic_x"], { id: "lic_x" }]) {
      h.server.handlers = [];
      refuseActivation(h, (req) =>
        h.server.denial(req, 403, "LICENSE_REVOKED", {
          ...FakeServer.subjectOf(req),
          ...(licenseId === undefined ? {} : { license_id: licenseId }),
        }),
      );
      const error: SdkError = await rejectsSdk(h.client.activate(LICENSE));
      expect(error).toMatchObject({ kind: "license", code: "LICENSE_REVOKED" });
    }
    expect(await remembered(h)).toEqual([]);
  });

  test("one signed for another device's key is refused and not remembered, whatever license it names", async () => {
    const h = harness();
    refuseActivation(h, (req) =>
      h.server.denial(req, 403, "LICENSE_REVOKED", {
        device_thumbprint: "0".repeat(64),
        license_id: "lic_victim",
      }),
    );
    expect((await rejectsSdk(h.client.activate(LICENSE))).code).toBe("ACTIVATION_MISMATCH");
    expect(await remembered(h)).toEqual([]);
  });

  test("an unsigned one, and a signed denial that is not about the license, are not remembered", async () => {
    const h = harness();
    refuseActivation(h, () =>
      FakeServer.error(403, "LICENSE_REVOKED", { details: { license_id: LICENSE_ID } }),
    );
    expect((await rejectsSdk(h.client.activate(LICENSE))).code).toBe("RESPONSE_UNSIGNED");
    h.server.handlers = [];
    refuseActivation(h, (req) =>
      h.server.denial(req, 410, "ACTIVATION_DEACTIVATED", {
        ...FakeServer.subjectOf(req),
        license_id: LICENSE_ID,
      }),
    );
    expect((await rejectsSdk(h.client.activate(LICENSE))).code).toBe("ACTIVATION_DEACTIVATED");
    expect(await remembered(h)).toEqual([]);
  });
});
