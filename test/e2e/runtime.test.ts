import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { LicensingClient, type SdkError } from "../../src/sdk/index.ts";
import { TestDevice } from "../support/device.ts";
import {
  api,
  BUILD_TIMEOUT_MS,
  initialisedDataDir,
  removeTempDirs,
  runCli,
  type ServerProcess,
  startServe,
} from "./binary.ts";

/**
 * The SDK against the compiled executable over real HTTP: both device key types, parallel
 * bursts against machine and seat limits, a replayed proof across a restart, and a key rotation
 * from the command line while the server runs.
 */
let dataDir: string;
let server: ServerProcess;
let liveKey: string;

beforeAll(async () => {
  ({ dataDir, liveKey } = await initialisedDataDir());
  server = await startServe(["--data-dir", dataDir]);
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await server?.stop("SIGKILL");
  removeTempDirs();
});

async function fixture(policy: Record<string, unknown>) {
  const code = `app-${Math.random().toString(36).slice(2, 10)}`;
  const product = await api(server.url, liveKey, "POST", "/mgmt/v1/products", {
    name: "App",
    code,
    environment: "live",
  });
  const productId = product.body.data.public_id as string;
  const created = await api(server.url, liveKey, "POST", "/mgmt/v1/policies", {
    product_id: productId,
    name: "P",
    ...policy,
  });
  const license = await api(server.url, liveKey, "POST", "/mgmt/v1/licenses", {
    product_id: productId,
    policy_id: created.body.data.public_id,
  });
  const config = (await api(server.url, liveKey, "GET", `/mgmt/v1/products/${productId}/integration-config`))
    .body.data.config;
  return {
    productId,
    licenseKey: license.body.data.key as string,
    licenseId: license.body.data.public_id as string,
    config,
  };
}

const machineInfo = { os: "linux", arch: "x64" };
const clientFor = (config: unknown, alg: "ed25519" | "p256" = "ed25519") =>
  new LicensingClient({ config: config as never, signingAlgorithm: alg });

describe.each(["ed25519", "p256"] as const)("the SDK with %s keys against the executable", (alg) => {
  test("activates, checks in, takes and releases a seat, reads signed time and deactivates", async () => {
    const fx = await fixture({ max_machines: 3, max_concurrent: 1 });
    const app = clientFor(fx.config, alg);
    const { activationId } = await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    expect((await app.heartbeat()).licenseStatus).toBe("active");
    const lease = await app.acquireLease("main");
    await app.heartbeatLease(lease.leaseId, "main");
    await app.releaseLease(lease.leaseId, "main");
    expect(Math.abs((await app.serverTime()).serverTime - Date.now() / 1000)).toBeLessThan(5);
    await app.deactivate();
    const seen = await api(server.url, liveKey, "GET", `/mgmt/v1/activations/${activationId}`);
    expect(seen.body.data).toMatchObject({ status: "deactivated", deactivation_reason: "device" });
  });
});

describe("limits under parallel load", () => {
  test("50 parallel activations against max_machines 5 leave exactly 5 activations", async () => {
    const fx = await fixture({ max_machines: 5 });
    const results = await Promise.allSettled(
      Array.from({ length: 50 }, () =>
        clientFor(fx.config).activate({ licenseKey: fx.licenseKey, machineInfo }),
      ),
    );
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(5);
    const refused = results
      .filter((r) => r.status === "rejected")
      .map((r) => ((r as PromiseRejectedResult).reason as SdkError).code);
    expect(new Set(refused)).toEqual(new Set(["MACHINE_LIMIT_REACHED"]));
    const listed = await api(
      server.url,
      liveKey,
      "GET",
      `/mgmt/v1/licenses/${fx.licenseId}/activations?limit=200`,
    );
    expect(listed.body.data.filter((a: { status: string }) => a.status === "active")).toHaveLength(5);
  });

  test("50 parallel lease requests against max_concurrent 3 leave exactly 3 leases", async () => {
    const fx = await fixture({ max_machines: 10, max_concurrent: 3, concurrency_unit: "instance" });
    const apps = Array.from({ length: 10 }, () => clientFor(fx.config));
    for (const app of apps) await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    const results = await Promise.allSettled(
      Array.from({ length: 50 }, (_, i) => (apps[i % 10] as LicensingClient).acquireLease(`instance-${i}`)),
    );
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(3);
    const codes = results
      .filter((r) => r.status === "rejected")
      .map((r) => ((r as PromiseRejectedResult).reason as SdkError).code);
    expect(new Set(codes)).toEqual(new Set(["CONCURRENCY_LIMIT_REACHED"]));
  });
});

describe("across a restart and a key rotation", () => {
  test("a device-proof nonce used before a restart is refused after it", async () => {
    const fx = await fixture({ max_machines: 2 });
    const device = new TestDevice("p256");
    const now = Math.floor(Date.now() / 1000);
    const activation = await api(
      server.url,
      null,
      "POST",
      "/runtime/v1/activations",
      device.activationBody({ licenseKey: fx.licenseKey, productId: fx.productId, clientTime: now }),
    );
    const id = activation.body.data.activation_id as string;
    const path = `/runtime/v1/activations/${id}/heartbeat`;
    const body = JSON.stringify({ machine_info_digest: machineInfoDigest(machineInfo) });
    const headers = {
      ...device.proofHeaders("POST", path, id, body, { timestamp: now }),
      "content-type": "application/json",
    };
    const first = await fetch(`${server.url}${path}`, { method: "POST", headers, body });
    expect(first.status).toBe(200);
    expect(await server.stop("SIGTERM")).toBe(0);
    server = await startServe(["--data-dir", dataDir]);
    const replay = await fetch(`${server.url}${path}`, { method: "POST", headers, body });
    expect(replay.status).toBe(401);
    expect(((await replay.json()) as { error: { details: { reason: string } } }).error.details.reason).toBe(
      "replayed",
    );
  });

  test("a signing key rotated from the command line is used at once, and the SDK accepts the new bundle", async () => {
    const fx = await fixture({ max_machines: 2 });
    const app = clientFor(fx.config);
    await app.activate({ licenseKey: fx.licenseKey, machineInfo });
    const rotated = await runCli([
      "signing-keys",
      "rotate",
      "--data-dir",
      dataDir,
      "--product",
      fx.productId,
      "--json",
    ]);
    expect(rotated.exitCode).toBe(0);
    const { key_id: newKey, trust_bundle_sequence: sequence } = JSON.parse(rotated.stdout);
    expect(sequence).toBe(2);
    expect((await app.heartbeat()).licenseStatus).toBe("active");
    // A raw activation shows which key the running server now signs certificates with.
    const raw = await api(
      server.url,
      null,
      "POST",
      "/runtime/v1/activations",
      new TestDevice().activationBody({
        licenseKey: fx.licenseKey,
        productId: fx.productId,
        clientTime: Math.floor(Date.now() / 1000),
      }),
    );
    const header = JSON.parse(
      Buffer.from((raw.body.data.certificate as string).split(".")[0] as string, "base64url").toString(),
    );
    expect(header.kid).toBe(newKey);
    expect((await app.licenseInfo()).state).toBe("valid");
    const bundle = await app.trustBundle();
    expect(bundle.sequence).toBe(2);
    expect(bundle.signing_keys.find((k: { key_id: string }) => k.key_id === newKey)?.status).toBe("active");
  });
});
