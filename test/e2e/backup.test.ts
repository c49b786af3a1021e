import { afterAll, beforeAll, expect, test } from "bun:test";
import { copyFileSync, existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { TestDevice } from "../support/device.ts";
import {
  api,
  BUILD_TIMEOUT_MS,
  cleanEnv,
  executable,
  initialisedDataDir,
  isListening,
  removeTempDirs,
  runCli,
  runServeToExit,
  type ServerProcess,
  startServe,
  tempDir,
} from "./binary.ts";

/**
 * `licensing backup` against a running executable that is busy creating products, customers and
 * licenses over HTTP, then `licensing restore` into a new directory and a second server on it.
 * Everything acknowledged before the backup started must be there, and must work: license keys
 * decrypt, products sign with the keys the keystore copy holds.
 */
const servers: ServerProcess[] = [];
let dataDir: string;
let liveKey: string;

beforeAll(async () => {
  ({ dataDir, liveKey } = await initialisedDataDir());
  servers.push(await startServe(["--data-dir", dataDir]));
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const server of servers) await server.stop("SIGKILL");
  removeTempDirs();
});

type Kind = "products" | "customers" | "licenses";
interface Acked {
  kind: Kind;
  id: string;
  /** What the create answered, to compare with what the restored server reads back. */
  data: Record<string, unknown>;
}

const WORKERS = 4;
const MAX_REQUESTS = 2_000;
const MAX_LOAD_MS = 20_000;
/** Each worker has its own API key and stays under the 100 requests/s per key limit. */
const PACE_MS = 15;

test("a backup taken under write load restores into a server that has every acknowledged write", async () => {
  const server = servers[0] as ServerProcess;
  const product = await api(server.url, liveKey, "POST", "/mgmt/v1/products", {
    name: "Base",
    code: "base",
    environment: "live",
  });
  const productId = product.body.data.public_id as string;
  const policy = await api(server.url, liveKey, "POST", "/mgmt/v1/policies", {
    product_id: productId,
    name: "Std",
    max_machines: 100,
  });
  const policyId = policy.body.data.public_id as string;

  const keys: string[] = [];
  for (let i = 0; i < WORKERS; i++) {
    const made = await runCli([
      "keys",
      "create",
      "--data-dir",
      dataDir,
      "--env",
      "live",
      "--scopes",
      "all",
      "--json",
    ]);
    keys.push(JSON.parse(made.stdout).api_key);
  }

  const acked: Acked[] = [];
  const statuses: number[] = [];
  let stop = false;
  let sent = 0;
  const started = Date.now();
  const worker = async (key: string, index: number) => {
    for (let n = 0; !stop && sent < MAX_REQUESTS && Date.now() - started < MAX_LOAD_MS; n++) {
      sent++;
      const kind: Kind = (["licenses", "customers", "products"] as const)[n % 3] as Kind;
      const body =
        kind === "licenses"
          ? { product_id: productId, policy_id: policyId, metadata: { worker: index, n } }
          : kind === "customers"
            ? { name: `Customer ${index}-${n}` }
            : { name: `P ${index}-${n}`, code: `p-${index}-${n}`, environment: "live" };
      const response = await api(server.url, key, "POST", `/mgmt/v1/${kind}`, body);
      statuses.push(response.status);
      if (response.status === 201)
        acked.push({ kind, id: response.body.data.public_id, data: response.body.data });
      await Bun.sleep(PACE_MS);
    }
  };
  const load = Promise.all(keys.map(worker));

  while (acked.length < 40 && Date.now() - started < MAX_LOAD_MS) await Bun.sleep(10);
  const ackedBeforeBackup = [...acked];
  const backupDir = join(tempDir(), "backup");
  const backup = await runCli(["backup", backupDir, "--data-dir", dataDir, "--json"]);
  const ackedBeforeBackupEnded = acked.length;
  // Keep writing a little after the backup, then stop the load.
  await Bun.sleep(200);
  stop = true;
  await load;

  expect(backup.exitCode).toBe(0);
  expect(backup.stderr).toContain("passphrase is not in the backup");
  // The load went on while the backup ran: writes were not blocked by it.
  expect(ackedBeforeBackupEnded).toBeGreaterThan(ackedBeforeBackup.length);
  expect(statuses.filter((status) => status !== 201 && status !== 429)).toEqual([]);
  expect(ackedBeforeBackup.map((a) => a.kind)).toEqual(
    expect.arrayContaining(["products", "customers", "licenses"]),
  );
  expect(readdirSync(backupDir).sort()).toEqual(["backup.json", "keystore.json", "licensing.db"]);

  const restoredDir = join(tempDir(), "restored");
  const passphraseFile = join(dataDir, "keystore.passphrase");
  const restore = await runCli([
    "restore",
    backupDir,
    "--data-dir",
    restoredDir,
    "--passphrase-file",
    passphraseFile,
    "--json",
  ]);
  expect(restore.exitCode).toBe(0);
  expect(JSON.parse(restore.stdout)).toMatchObject({ data_dir: restoredDir, applied: [] });

  const restored = await startServe(["--data-dir", restoredDir, "--passphrase-file", passphraseFile]);
  servers.push(restored);
  for (const item of ackedBeforeBackup) {
    const read = await api(restored.url, liveKey, "GET", `/mgmt/v1/${item.kind}/${item.id}`);
    expect({ id: item.id, status: read.status }).toEqual({ id: item.id, status: 200 });
    // Everything the create answered, the license key (decrypted with the restored data key) included.
    expect(read.body.data).toEqual(item.data);
  }

  // The newest product from before the backup signs with a key only the keystore copy can hold.
  const lastProduct = ackedBeforeBackup.findLast((a) => a.kind === "products") as Acked;
  const lastPolicy = await api(restored.url, liveKey, "POST", "/mgmt/v1/policies", {
    product_id: lastProduct.id,
    name: "After restore",
  });
  const newLicense = await api(restored.url, liveKey, "POST", "/mgmt/v1/licenses", {
    product_id: lastProduct.id,
    policy_id: lastPolicy.body.data.public_id,
  });
  expect(newLicense.status).toBe(201);
  const now = Math.floor(Date.now() / 1000);
  for (const [license, product] of [
    [newLicense.body.data, lastProduct.id],
    [ackedBeforeBackup.find((a) => a.kind === "licenses")?.data, productId],
  ] as const) {
    const activation = await api(
      restored.url,
      null,
      "POST",
      "/runtime/v1/activations",
      new TestDevice().activationBody({
        licenseKey: license?.key as string,
        productId: product,
        clientTime: now,
      }),
    );
    expect(activation.status).toBe(201);
    expect(typeof activation.body.data.certificate).toBe("string");
  }
}, 60_000);

/** The staging folder of a running restore once it holds the backup's files, polled as they land. */
async function stagingOnceFilled(dataDir: string, deadline: number): Promise<string> {
  while (Date.now() < deadline) {
    const staging = existsSync(dataDir)
      ? readdirSync(dataDir).find((n) => n.startsWith(".restore-"))
      : undefined;
    if (staging && existsSync(join(dataDir, staging, "keystore.json"))) return staging;
    await Bun.sleep(2);
  }
  throw new Error(`no filled .restore-* folder appeared in ${dataDir}`);
}

test("a restore stopped half-way leaves a directory serve refuses instead of initialising, and the restore run again brings the backup back", async () => {
  const server = servers[0] as ServerProcess;
  const product = await api(server.url, liveKey, "POST", "/mgmt/v1/products", {
    name: "Before the backup",
    code: "before-backup",
    environment: "live",
  });
  const backupDir = join(tempDir(), "backup");
  expect((await runCli(["backup", backupDir, "--data-dir", dataDir])).exitCode).toBe(0);
  const target = join(tempDir(), "target");
  const passphraseFile = join(dataDir, "keystore.passphrase");
  const restoreArgs = ["restore", backupDir, "--data-dir", target, "--passphrase-file", passphraseFile];

  // SIGTERM while the restore checks the backup in its staging folder (opening the keystore copy
  // with the passphrase, scrypt, takes a noticeable while): the process dies where it stands.
  const restore = Bun.spawn([executable(), ...restoreArgs], {
    env: cleanEnv(),
    stdout: "ignore",
    stderr: "ignore",
  });
  const staging = await stagingOnceFilled(target, Date.now() + 10_000);
  restore.kill("SIGTERM");
  expect(await restore.exited).not.toBe(0);
  expect(readdirSync(target)).toEqual([staging]);

  const served = await runServeToExit(["--data-dir", target, "--passphrase-file", passphraseFile]);
  expect(served.exitCode).toBe(1);
  expect(served.stderr).toContain(
    `a restore into ${target} did not finish (it left ${join(target, staging)})`,
  );
  expect(served.stdout).not.toContain("lsk_");
  expect(await isListening(served.port)).toBe(false);
  expect(readdirSync(target)).toEqual([staging]);

  const again = await runCli(restoreArgs);
  expect(again.exitCode).toBe(0);
  expect(again.stderr).toContain(`Removed ${join(target, staging)}`);
  expect(readdirSync(target).sort()).toEqual(["keystore.json", "licensing.db"]);
  const restored = await startServe(["--data-dir", target, "--passphrase-file", passphraseFile]);
  servers.push(restored);
  const read = await api(restored.url, liveKey, "GET", `/mgmt/v1/products/${product.body.data.public_id}`);
  expect(read.status).toBe(200);
}, 60_000);

test("serve refuses a data dir whose keystore is another install's (it opens, but its data key does not decrypt the store) instead of answering 500 on license reads", async () => {
  const server = servers[0] as ServerProcess;
  const product = await api(server.url, liveKey, "POST", "/mgmt/v1/products", {
    name: "Keyed",
    code: "keyed",
    environment: "live",
  });
  const policy = await api(server.url, liveKey, "POST", "/mgmt/v1/policies", {
    product_id: product.body.data.public_id,
    name: "Std",
  });
  const license = await api(server.url, liveKey, "POST", "/mgmt/v1/licenses", {
    product_id: product.body.data.public_id,
    policy_id: policy.body.data.public_id,
  });
  expect(license.status).toBe(201);
  const backupDir = join(tempDir(), "backup");
  expect((await runCli(["backup", backupDir, "--data-dir", dataDir])).exitCode).toBe(0);
  const passphraseFile = join(dataDir, "keystore.passphrase");
  const target = join(tempDir(), "target");
  const restore = await runCli([
    "restore",
    backupDir,
    "--data-dir",
    target,
    "--passphrase-file",
    passphraseFile,
  ]);
  expect(restore.exitCode).toBe(0);
  // Another install sealed with the same passphrase: its keystore opens where this one did.
  const other = join(tempDir(), "other");
  expect((await runCli(["init", "--data-dir", other, "--passphrase-file", passphraseFile])).exitCode).toBe(0);
  copyFileSync(join(other, "keystore.json"), join(target, "keystore.json"));

  const served = await runServeToExit(["--data-dir", target, "--passphrase-file", passphraseFile]);
  expect(served.exitCode).toBe(1);
  // Which license is tried first depends on what the earlier tests created.
  expect(served.stderr).toContain(
    "licensing serve: the keystore's data key does not decrypt the store's secrets (licenses.key_ciphertext of lic_",
  );
  expect(served.stderr).toContain(
    `): ${join(target, "keystore.json")} is not the keystore of this store; put back the one that belongs with it (restore both from one backup)\n`,
  );
  expect(served.stderr).not.toContain('"msg":"listening"');
  expect(await isListening(served.port)).toBe(false);
}, 60_000);
