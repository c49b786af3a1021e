import { TestDevice } from "../../support/device.ts";
import { type BenchDevice, MACHINE_INFO, nowSec } from "./requests.ts";
import { mgmt, runCli } from "./server.ts";

export interface Fixture {
  productId: string;
  policyId: string;
  /** The license every bench device activates on. */
  licenseKey: string;
  licenseId: string;
  /** Every license of the product (the main one first); the management list pages over them. */
  licenseIds: string[];
  licenseKeys: string[];
}

/** The policy of the bench: room for every device and seat, heartbeats and leases as the plan allows. */
export const BENCH_POLICY = {
  name: "Bench policy",
  max_machines: 1_000_000,
  max_concurrent: 1_000_000,
  concurrency_unit: "instance",
  heartbeat_required: true,
  heartbeat_sec: 3_600,
  network_grace_sec: 3 * 86_400,
  cert_ttl_sec: 7 * 86_400,
  lease_ttl_sec: 3_600,
  lease_heartbeat_sec: 300,
} as const;

/** A product, the bench policy and `licenses` licenses over the Management API. */
export async function createFixture(url: string, key: string, licenses: number): Promise<Fixture> {
  const product = await mgmt(url, key, "POST", "/mgmt/v1/products", {
    name: "Bench product",
    code: `bench-${Date.now().toString(36)}`,
    environment: "live",
  });
  const productId = product.body.data.public_id as string;
  const policy = await mgmt(url, key, "POST", "/mgmt/v1/policies", {
    product_id: productId,
    ...BENCH_POLICY,
  });
  const policyId = policy.body.data.public_id as string;
  const created: { id: string; key: string }[] = [];
  for (let i = 0; i < licenses; i++) {
    const license = await mgmt(url, key, "POST", "/mgmt/v1/licenses", {
      product_id: productId,
      policy_id: policyId,
    });
    created.push({ id: license.body.data.public_id as string, key: license.body.data.key as string });
  }
  const main = created[0];
  if (!main) throw new Error("no license created");
  return {
    productId,
    policyId,
    licenseKey: main.key,
    licenseId: main.id,
    licenseIds: created.map((l) => l.id),
    licenseKeys: created.map((l) => l.key),
  };
}

/**
 * Activates `count` new devices over HTTP, `parallel` at a time, each with its own Ed25519 key and
 * a fresh proof, exactly as an app would. Any answer but 201 stops the bench.
 */
export async function activateDevices(
  url: string,
  fixture: Fixture,
  count: number,
  parallel: number,
  onProgress?: (done: number) => void,
): Promise<BenchDevice[]> {
  const devices: BenchDevice[] = [];
  let next = 0;
  let counter = 0;
  const worker = async () => {
    while (next < count) {
      next++;
      const device = new TestDevice("ed25519");
      const body = device.activationBody({
        licenseKey: fixture.licenseKey,
        productId: fixture.productId,
        clientTime: nowSec(),
        machineInfo: { ...MACHINE_INFO },
      });
      const response = await fetch(`${url}/runtime/v1/activations`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "idempotency-key": `setup-${process.pid}-${++counter}-${Date.now()}`,
        },
        body: JSON.stringify(body),
      });
      const text = await response.text();
      if (response.status !== 201) throw new Error(`activation answered ${response.status}: ${text}`);
      const parsed = JSON.parse(text) as { data: { activation_id: string } };
      devices.push({ signer: device, activationId: parsed.data.activation_id });
      if (devices.length % 1000 === 0) onProgress?.(devices.length);
    }
  };
  await Promise.all(Array.from({ length: parallel }, worker));
  return devices;
}

/** Live API keys with every scope, made with `licensing keys create` (the per-key limit is 100/s). */
export async function createApiKeys(dataDir: string, count: number): Promise<string[]> {
  const keys: string[] = [];
  const one = async (i: number) => {
    const result = await runCli([
      "keys",
      "create",
      "--data-dir",
      dataDir,
      "--env",
      "live",
      "--scopes",
      "all",
      "--name",
      `bench-${i}`,
      "--json",
    ]);
    if (result.exitCode !== 0) throw new Error(`keys create failed: ${result.stderr}`);
    keys.push(JSON.parse(result.stdout).api_key as string);
  };
  for (let i = 0; i < count; i += 4) {
    await Promise.all(Array.from({ length: Math.min(4, count - i) }, (_, k) => one(i + k)));
  }
  return keys;
}
