import { afterAll, beforeAll, expect, test } from "bun:test";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { LicensingClient, MemoryStorage } from "../../src/sdk/index.ts";
import {
  api,
  BUILD_TIMEOUT_MS,
  executable,
  removeTempDirs,
  runCli,
  type ServerProcess,
  startServe,
  tempDir,
} from "./binary.ts";

/**
 * The compiled executable on an air-gapped host: with no server running, `licensing offline
 * issue` makes a package from the data dir and `licensing seal` seals a file from the public
 * line alone; the SDK accepts both, and a restarted server releases the file's key.
 */
let work: string;
let dataDir: string;
let server: ServerProcess | undefined;
let liveKey: string;

beforeAll(async () => {
  executable();
  work = tempDir();
  dataDir = join(work, "data");
  liveKey = JSON.parse((await runCli(["init", "--data-dir", dataDir, "--json"])).stdout).api_keys.live;
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await server?.stop("SIGKILL");
  removeTempDirs();
});

test("offline issue and seal work from the data dir with no server, and the SDK accepts what they make", async () => {
  server = await startServe(["--data-dir", dataDir]);
  const url = server.url;
  const product = (
    await api(url, liveKey, "POST", "/mgmt/v1/products", { name: "Air", code: "air", environment: "live" })
  ).body.data;
  const policy = (
    await api(url, liveKey, "POST", "/mgmt/v1/policies", {
      product_id: product.public_id,
      name: "Hybrid",
      validation_mode: "hybrid",
      entitlements: { pro: true },
    })
  ).body.data;
  const license = (
    await api(url, liveKey, "POST", "/mgmt/v1/licenses", {
      product_id: product.public_id,
      policy_id: policy.public_id,
    })
  ).body.data;
  const config = (await api(url, liveKey, "GET", `/mgmt/v1/products/${product.public_id}/integration-config`))
    .body.data.config;
  const sealingKey = (await api(url, liveKey, "POST", `/mgmt/v1/products/${product.public_id}/sealed-files`))
    .body.data.current_key.sealing_key;
  expect(await server.stop()).toBe(0);
  server = undefined;

  // Air-gapped from here: the device's request travels by file, and so does the package.
  const storage = new MemoryStorage();
  const app = new LicensingClient({ config, storage });
  writeFileSync(
    join(work, "request.json"),
    JSON.stringify(await app.createOfflineRequest({ machineInfo: { os: "linux", arch: "arm64" } })),
  );
  const issued = await runCli(
    [
      "offline",
      "issue",
      "--data-dir",
      dataDir,
      "--base-url",
      url,
      "--license",
      license.public_id,
      "--request",
      "request.json",
      "--out",
      "package.zip",
    ],
    { cwd: work },
  );
  expect(issued.stderr).toBe("");
  expect(issued.exitCode).toBe(0);
  const unzip = spawnSync("unzip", ["-t", join(work, "package.zip")], { encoding: "utf8" });
  expect(unzip.status).toBe(0);
  await app.loadOfflinePackage(new Uint8Array(readFileSync(join(work, "package.zip"))));
  expect(await app.licenseState()).toBe("valid");

  const plain = new Uint8Array(100_000).map((_, i) => (i * 31) % 256);
  writeFileSync(join(work, "asset.bin"), plain);
  const seal = await runCli(
    ["seal", "--sealing-key", sealingKey, "--entitlement", "pro", "asset.bin", "asset.sealed"],
    { cwd: work },
  );
  expect([seal.exitCode, seal.stderr]).toEqual([0, ""]);

  // Back online, the device that holds the package gets the file's key from the executable.
  server = await startServe(["--data-dir", dataDir], { port: Number(new URL(url).port) });
  const online = new LicensingClient({ config, storage });
  const opened = await online.openSealedFile(new Uint8Array(readFileSync(join(work, "asset.sealed"))));
  expect(new Uint8Array(await new Response(opened.stream).arrayBuffer())).toEqual(plain);
  const events = (await api(server.url, liveKey, "GET", "/mgmt/v1/events")).body.data;
  expect(events.find((e: { type: string }) => e.type === "license.offline_package_issued")?.actor.type).toBe(
    "cli",
  );
}, 60_000);
