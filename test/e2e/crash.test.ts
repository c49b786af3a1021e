import { Database } from "bun:sqlite";
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { TestDevice } from "../support/device.ts";
import {
  api,
  BUILD_TIMEOUT_MS,
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
 * Crash safety: `kill -9` of the executable in the middle of a write load (creates of products,
 * which also write the keystore, customers and licenses; license changes; runtime activations),
 * then a restart on the same data dir. Every acknowledged write must be there, the store must
 * pass SQLite's integrity check, and every request that was cut off must be safe to retry with
 * its Idempotency-Key: done exactly once, never twice, never stuck "in flight".
 */
const servers: ServerProcess[] = [];
let dataDir: string;
let liveKey: string;

beforeAll(async () => {
  ({ dataDir, liveKey } = await initialisedDataDir());
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const server of servers) if (server.proc.exitCode === null) await server.stop("SIGKILL");
  removeTempDirs();
});

interface Write {
  kind: "products" | "customers" | "licenses" | "license-change" | "activation";
  path: string;
  body: Record<string, unknown>;
  idempotencyKey?: string;
  /** Set once the server answered 2xx. */
  acked?: Record<string, unknown>;
}

const WORKERS = 4;
const ACKED_BEFORE_KILL = 80;
const MAX_LOAD_MS = 20_000;

test("after kill -9 under write load, every acknowledged write is there and cut-off ones retry exactly once", async () => {
  let server = await startServe(["--data-dir", dataDir]);
  servers.push(server);
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
  const product = await api(server.url, liveKey, "POST", "/mgmt/v1/products", {
    name: "Base",
    code: "base",
    environment: "live",
  });
  const productId = product.body.data.public_id as string;
  const policy = await api(server.url, liveKey, "POST", "/mgmt/v1/policies", {
    product_id: productId,
    name: "P",
  });
  const policyId = policy.body.data.public_id as string;

  const writes: Write[] = [];
  let killed = false;
  const started = Date.now();
  const send = async (key: string | null, write: Write) => {
    writes.push(write);
    const headers: Record<string, string> = write.idempotencyKey
      ? { "idempotency-key": write.idempotencyKey }
      : {};
    const method = write.kind === "license-change" ? "PATCH" : "POST";
    const response = await api(server.url, key, method, write.path, write.body, headers);
    if (response.status >= 200 && response.status < 300) write.acked = response.body.data;
    else if (response.status !== 429)
      throw new Error(`unexpected ${response.status} ${JSON.stringify(response.body)}`);
    return response;
  };
  const worker = async (key: string, index: number) => {
    for (let n = 0; !killed && Date.now() - started < MAX_LOAD_MS; n++) {
      const tag = `w${index}-${n}`;
      try {
        await send(key, {
          kind: "products",
          path: "/mgmt/v1/products",
          body: { name: `P ${tag}`, code: `p-${tag}`, environment: "live" },
          idempotencyKey: `crash-product-${tag}`,
        });
        await send(key, {
          kind: "customers",
          path: "/mgmt/v1/customers",
          body: { name: `C ${tag}` },
          idempotencyKey: `crash-customer-${tag}`,
        });
        const license = await send(key, {
          kind: "licenses",
          path: "/mgmt/v1/licenses",
          body: { product_id: productId, policy_id: policyId, metadata: { tag } },
          idempotencyKey: `crash-license-${tag}`,
        });
        if (license.status !== 201) continue;
        const id = license.body.data.public_id as string;
        await send(key, {
          kind: "license-change",
          path: `/mgmt/v1/licenses/${id}`,
          body: { metadata: { tag, changed: true } },
        });
        await send(null, {
          kind: "activation",
          path: "/runtime/v1/activations",
          body: new TestDevice().activationBody({
            licenseKey: license.body.data.key,
            productId,
            clientTime: Math.floor(Date.now() / 1000),
          }),
          idempotencyKey: `crash-activation-${tag}`,
        });
      } catch (error) {
        // Once the server is killed, requests fail to connect; before that, nothing may fail.
        if (!killed) throw error;
        return;
      }
    }
  };
  const load = Promise.all(keys.map(worker));
  while (writes.filter((w) => w.acked).length < ACKED_BEFORE_KILL && Date.now() - started < MAX_LOAD_MS) {
    await Bun.sleep(5);
  }
  killed = true;
  server.proc.kill("SIGKILL");
  await server.proc.exited;
  await load;

  const acked = writes.filter((w) => w.acked);
  const cutOff = writes.filter((w) => !w.acked);
  expect(acked.length).toBeGreaterThanOrEqual(ACKED_BEFORE_KILL);
  expect(new Set(acked.map((w) => w.kind))).toEqual(
    new Set(["products", "customers", "licenses", "license-change", "activation"]),
  );

  // Nothing half-written: SQLite recovers the WAL and finds the file sound.
  const check = new Database(join(dataDir, "licensing.db"));
  expect(check.query("PRAGMA integrity_check").all()).toEqual([{ integrity_check: "ok" }]);
  check.close();

  server = await startServe(["--data-dir", dataDir]);
  servers.push(server);
  for (const write of acked) {
    if (write.kind === "activation") {
      const read = await api(
        server.url,
        liveKey,
        "GET",
        `/mgmt/v1/activations/${write.acked?.activation_id}`,
      );
      expect({ path: write.path, status: read.status }).toEqual({ path: write.path, status: 200 });
      continue;
    }
    const path = write.kind === "license-change" ? write.path : `${write.path}/${write.acked?.public_id}`;
    const read = await api(server.url, liveKey, "GET", path);
    expect({ path, status: read.status }).toEqual({ path, status: 200 });
    // Later acknowledged changes (the license change after its create) may have moved it on.
    if (write.kind !== "licenses") expect(read.body.data).toEqual(write.acked);
    else expect(read.body.data.key).toBe(write.acked?.key);
  }

  // Each cut-off create, retried with its key, happens exactly once: replayed if it had committed.
  const retried = cutOff.filter((w) => w.idempotencyKey && w.kind !== "activation");
  for (const write of retried) {
    const key = keys[Number(/w(\d+)-/.exec(write.idempotencyKey ?? "")?.[1])] as string;
    const again = await api(server.url, key, "POST", write.path, write.body, {
      "idempotency-key": write.idempotencyKey as string,
    });
    expect({ key: write.idempotencyKey, status: again.status }).toEqual({
      key: write.idempotencyKey,
      status: 201,
    });
  }
  const products = await api(server.url, liveKey, "GET", "/mgmt/v1/products?limit=200");
  const codes = products.body.data.map((p: { code: string }) => p.code);
  expect(codes.length).toBe(new Set(codes).size);
  // A product made just before the kill signs with a key the keystore kept: keys and store agree.
  const lastProduct = acked.findLast((w) => w.kind === "products")?.acked?.public_id as string;
  expect(
    (await api(server.url, null, "GET", `/runtime/v1/products/${lastProduct}/trust-bundle`)).status,
  ).toBe(200);
  // And new writes work at once, keystore writes included (no lock left behind by the dead process).
  const fresh = await api(server.url, liveKey, "POST", "/mgmt/v1/products", {
    name: "After",
    code: "after",
    environment: "live",
  });
  expect(fresh.status).toBe(201);
  expect(await server.stop("SIGTERM")).toBe(0);
}, 90_000);

test("a truncated keystore or a store that is not SQLite is refused at start with one clear line", async () => {
  const dir = join(tempDir(), "data");
  expect((await runCli(["init", "--data-dir", dir])).exitCode).toBe(0);
  const keystore = readFileSync(join(dir, "keystore.json"));
  writeFileSync(join(dir, "keystore.json"), keystore.subarray(0, keystore.length / 2));
  const truncated = await runServeToExit(["--data-dir", dir]);
  expect(truncated.exitCode).toBe(1);
  expect(truncated.stderr.trim()).toBe(
    "licensing serve: cannot open the keystore: the keystore file is not valid JSON (truncated or corrupted)",
  );
  expect(await isListening(truncated.port)).toBe(false);

  writeFileSync(join(dir, "keystore.json"), keystore);
  writeFileSync(join(dir, "licensing.db"), "this is not a database, it was overwritten by mistake");
  const garbage = await runServeToExit(["--data-dir", dir]);
  expect(garbage.exitCode).toBe(1);
  expect(garbage.stderr).toMatch(
    /^licensing serve: the store .*licensing\.db is not a SQLite database, but a keystore exists; restore the store from a backup\n$/,
  );
});
