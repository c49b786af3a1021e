import { describe, expect, test } from "bun:test";
import { machineInfoDigest, thumbprint } from "../../src/sdk/index.ts";
import { rejectsSdk } from "./support/expect.ts";
import { FakeServer } from "./support/fake-server.ts";
import { nodeSha256Hex } from "./support/node-crypto.ts";
import { activated, harness, MACHINE } from "./support/setup.ts";

describe("activation", () => {
  for (const alg of ["ed25519", "p256"] as const) {
    test(`a device with a new ${alg} signing key activates and the server accepts its proof`, async () => {
      const h = harness({ signingAlgorithm: alg });
      const result = await h.client.activate({
        licenseKey: "LK-1234",
        machineInfo: MACHINE,
        machineSignals: { disk: "abc" },
      });
      expect(h.server.proofFailures).toEqual([]);
      const keys = await h.client.deviceKeys();
      expect(keys.signing.publicKey.startsWith(`${alg}:`)).toBe(true);
      expect(result.activationId).toMatch(/^act_/);
      expect(result.licenseId).toBe("lic_01JTESTLICENSE00000000000000");
      expect(result.certificate.cnf.jkt).toBe(thumbprint(keys.signing.publicKey));
      expect(result.machineInfoDigest).toBe(
        nodeSha256Hex('{"arch":"x64","hostname":"build-7","os":"linux"}'),
      );
      expect(await h.client.activationId()).toBe(result.activationId);
      expect(await h.client.licenseState()).toBe("valid");
    });
  }

  test("the activation request carries exactly the contract's fields, a fresh nonce and an idempotency key", async () => {
    const h = await activated();
    const bundleRequests = h.server.requests.filter((r) => r.method === "GET");
    expect(bundleRequests.map((r) => r.url)).toEqual([
      `https://licensing.example.test/runtime/v1/products/${h.server.authority.productId}/trust-bundle`,
    ]);
    const req = h.server.requests.find((r) => r.path === "/runtime/v1/activations")!;
    const keys = await h.client.deviceKeys();
    expect(Object.keys(req.json!).sort()).toEqual([
      "app_version",
      "client_time",
      "device_kem_public_key",
      "device_proof",
      "device_signing_public_key",
      "license_key",
      "machine_info",
      "machine_signals",
      "nonce",
      "product_id",
      "sdk_version",
    ]);
    expect(req.json).toMatchObject({
      license_key: "LK-1234",
      product_id: h.server.authority.productId,
      device_signing_public_key: keys.signing.publicKey,
      device_kem_public_key: keys.kem.publicKey,
      machine_info: MACHINE,
      machine_signals: {},
      app_version: "2.0.0",
      sdk_version: "0.1.0",
      client_time: 1_800_000_000,
    });
    expect(req.json!.nonce).toMatch(/^[A-Za-z0-9_-]{22}$/);
    expect(req.headers["idempotency-key"]).toMatch(/^[A-Za-z0-9_-]{32}$/);
    expect(req.headers["content-type"]).toBe("application/json");
  });

  test("a named-user token is sent and covered by the activation proof", async () => {
    const h = harness();
    await h.client.activate({ licenseKey: "LK", machineInfo: MACHINE, namedUserToken: "nut_123" });
    const req = h.server.requests.find((r) => r.path === "/runtime/v1/activations")!;
    expect(req.json!.named_user_token).toBe("nut_123");
    expect(h.server.proofFailures).toEqual([]);
  });

  test("a certificate issued for another device key is refused and nothing is stored", async () => {
    const h = harness();
    h.server.certificateClaims = { cnf: { jkt: "f".repeat(64) } };
    const e = await rejectsSdk(h.client.activate({ licenseKey: "LK", machineInfo: MACHINE }));
    expect(e.code).toBe("CERTIFICATE_DEVICE_MISMATCH");
    expect(await h.client.activationId()).toBeUndefined();
    expect(await h.client.licenseState()).toBe("invalid");
  });

  test("a machine_info_digest that differs from the SDK's own is refused", async () => {
    const h = harness();
    h.server.handlers.push((req) => {
      if (req.path !== "/runtime/v1/activations") return undefined;
      h.server.activations.set("act_x", {
        publicKey: req.json!.device_signing_public_key as string,
        machineInfo: {},
      });
      const data = {
        activation_id: "act_x",
        certificate: h.server.certificateFor("act_x", "0".repeat(64)),
        machine_info_digest: "0".repeat(64),
      };
      return h.server.signed(req, data, 201, req.json!.nonce as string);
    });
    const e = await rejectsSdk(h.client.activate({ licenseKey: "LK", machineInfo: MACHINE }));
    expect(e.code).toBe("MACHINE_INFO_DIGEST_MISMATCH");
    expect(e.details.expected).toBe(machineInfoDigest(MACHINE));
    expect(await h.client.activationId()).toBeUndefined();
  });

  test("activating twice is refused until the device is deactivated", async () => {
    const h = await activated();
    expect((await rejectsSdk(h.client.activate({ licenseKey: "LK", machineInfo: MACHINE }))).code).toBe(
      "ALREADY_ACTIVATED",
    );
    await h.client.deactivate();
    const again = await h.client.activate({ licenseKey: "LK", machineInfo: MACHINE });
    expect(again.activationId).not.toBe("");
  });

  test("bad arguments are refused before any request is made", async () => {
    const h = harness();
    const bad = [
      { licenseKey: "", machineInfo: MACHINE },
      { licenseKey: "LK", machineInfo: { os: "linux" } },
      { licenseKey: "LK", machineInfo: MACHINE, machineSignals: { a: 1 } },
    ];
    for (const options of bad) {
      // biome-ignore lint/suspicious/noExplicitAny: deliberately wrong argument types
      expect((await rejectsSdk(h.client.activate(options as any))).code).toBe("INVALID_ARGUMENT");
    }
    expect(h.server.requests).toEqual([]);
  });

  test("an authentic LICENSE_REVOKED answer to an activation is surfaced as license state", async () => {
    const h = harness();
    h.server.handlers.push((req) =>
      req.path === "/runtime/v1/activations" ? h.server.denial(req, 403, "LICENSE_REVOKED") : undefined,
    );
    const e = await rejectsSdk(h.client.activate({ licenseKey: "LK", machineInfo: MACHINE }));
    expect(e.code).toBe("LICENSE_REVOKED");
    expect(e.kind).toBe("license");
    expect(e.authentic).toBe(true);
    expect(e.status).toBe(403);
  });

  test("an authentic LICENSE_REVOKED answer to an activation that names another device key is refused", async () => {
    const h = harness();
    h.server.handlers.push((req) =>
      req.path === "/runtime/v1/activations"
        ? h.server.denial(req, 403, "LICENSE_REVOKED", { device_thumbprint: "0".repeat(64) })
        : undefined,
    );
    const e = await rejectsSdk(h.client.activate({ licenseKey: "LK", machineInfo: MACHINE }));
    expect(e).toMatchObject({ code: "ACTIVATION_MISMATCH", kind: "verification", authentic: false });
    expect(e.details).toMatchObject({ server_code: "LICENSE_REVOKED", field: "device_thumbprint" });
  });

  test("an activation refused for clock skew is retried once after learning the signed server time", async () => {
    const h = harness();
    h.clock.ms -= 3600_000;
    h.server.handlers.push((req) => {
      if (req.path !== "/runtime/v1/activations") return undefined;
      const skew = Math.abs((req.json!.client_time as number) - h.server.serverTime);
      return skew > 300
        ? FakeServer.error(401, "CLOCK_SKEW", { details: { server_time: h.server.serverTime } })
        : undefined;
    });
    await h.client.activate({ licenseKey: "LK", machineInfo: MACHINE });
    const paths = h.server.requests.filter((r) => r.method === "POST").map((r) => r.path);
    expect(paths).toEqual(["/runtime/v1/activations", "/runtime/v1/time", "/runtime/v1/activations"]);
    const [first, , second] = h.server.requests.filter((r) => r.method === "POST");
    expect(first!.headers["idempotency-key"]).not.toBe(second!.headers["idempotency-key"]);
  });
});
