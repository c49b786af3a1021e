import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createApp } from "../../src/app.ts";
import { finishInit, initialise } from "../../src/cli/init.ts";
import { resolveConfig } from "../../src/config.ts";
import { systemClock } from "../../src/domain/clock.ts";
import { LicensingClient, MemoryStorage } from "../../src/sdk/index.ts";
import { buildDeps, openKeystore } from "../../src/server.ts";
import { openStore, type Store } from "../../src/store/db.ts";
import { expectValidBundle, type TrustBundleBody } from "../support/envelope.ts";
import { runInProcess } from "../support/in-process-cli.ts";
import { managementRequest } from "../support/management-request.ts";
import { MACHINE } from "../support/offline.ts";

/**
 * `licensing signing-keys rotate` and `retire` run through the real command-line entry point on
 * the data dir of a server that keeps writing: each change is one write transaction, so the
 * server's commits can neither break it half-way nor leave the trust bundle behind the keys.
 */
const BASE = "http://licensing.test";
const work = mkdtempSync(join(tmpdir(), "signing-keys-cli-"));
const dataDir = join(work, "data");
let store: Store;
let app: ReturnType<typeof createApp>;
let liveKey: string;
let productId: string;
let rootPublicKey: string;
let licenseId: string;
// biome-ignore lint/suspicious/noExplicitAny: the integration config is JSON from the API.
let config: any;

async function api(method: string, path: string, body?: unknown) {
  const response = await app.handle(managementRequest(BASE, liveKey, method, path, body));
  return { status: response.status, bytes: new Uint8Array(await response.arrayBuffer()) };
}
const json = (bytes: Uint8Array) => JSON.parse(new TextDecoder().decode(bytes));

/** Runs `licensing signing-keys` in this process and captures what it prints. */
async function cli(args: string[]) {
  const result = await runInProcess(["signing-keys", ...args, "--data-dir", dataDir], work);
  // The server in this process reads the store's data_version once per turn of its event loop
  // (trust/service.ts); a real server's next request is a new turn, so give it one.
  await new Promise((resolve) => setImmediate(resolve));
  return result;
}

/**
 * Runs the command while "the server" (its own connection) commits a write at every clock read
 * the command makes, i.e. between any two of its steps, as a busy server would. The server's
 * connection does not wait for the lock: while the command holds it, its write is refused
 * instead, which is counted; with `failUnderLock` the command's clock read then throws, a
 * failure in the middle of the change.
 */
async function whileServerWrites(args: string[], options: { failUnderLock?: boolean } = {}) {
  const server = new Database(join(dataDir, "licensing.db"));
  server.run("PRAGMA busy_timeout = 0");
  const writes = { committed: 0, refused: 0 };
  const now = systemClock.now;
  systemClock.now = () => {
    try {
      server.run("INSERT INTO server_writes (at) VALUES (?)", [Date.now()]);
      writes.committed++;
    } catch (error) {
      if (!/locked|busy/i.test(String(error))) throw error;
      writes.refused++;
      if (options.failUnderLock) throw new Error("simulated failure inside the change");
    }
    return now();
  };
  try {
    return { ...(await cli(args)), writes };
  } finally {
    systemClock.now = now;
    server.close();
  }
}

const keyRows = () =>
  store.sqlite
    .query<{ key_id: string; status: string; not_after: number | null }, [string]>(
      "SELECT key_id, status, not_after FROM signing_keys WHERE product_id = ? ORDER BY rowid",
    )
    .all(productId);
const activeKey = () => keyRows().find((k) => k.status === "active")?.key_id;
const auditTypes = () =>
  store.sqlite
    .query<{ type: string }, [string]>(
      "SELECT type FROM audit_events WHERE target_id = ? AND type LIKE 'signing_key.%' ORDER BY id",
    )
    .all(productId)
    .map((row) => row.type);
/** An offline package for a new device, signed by the active key; answers its expiry in Unix seconds. */
async function offlinePackage(license = licenseId): Promise<number> {
  const device = new LicensingClient({
    config,
    storage: new MemoryStorage(),
    fetch: ((url: string, init?: RequestInit) => app.handle(new Request(url, init))) as never,
  });
  const response = await api("POST", `/mgmt/v1/licenses/${license}/offline-certificates`, {
    request: await device.createOfflineRequest({ machineInfo: MACHINE }),
  });
  expect(response.status).toBe(200);
  return (await device.loadOfflinePackage(response.bytes)).expiresAt;
}

async function bundle(): Promise<TrustBundleBody> {
  const response = await app.handle(new Request(`${BASE}/runtime/v1/products/${productId}/trust-bundle`));
  const data = (await response.json()).data;
  expectValidBundle(data, rootPublicKey);
  return data.bundle;
}

let policyId: string;
/** A license of the product that expires in `days`; answers its id. */
async function newLicense(days: number): Promise<string> {
  const expiresAt = new Date(Date.now() + days * 86_400_000).toISOString();
  const created = await api("POST", "/mgmt/v1/licenses", {
    product_id: productId,
    policy_id: policyId,
    expires_at: expiresAt,
  });
  expect(created.status).toBe(201);
  return json(created.bytes).data.public_id;
}

beforeAll(async () => {
  const init = initialise(resolveConfig({ "data-dir": dataDir }, {}, work));
  // As `licensing init` does once the keys are shown: the staging folder and the lock go.
  finishInit(init);
  liveKey = init.apiKeys.live;
  const passphrase = readFileSync(join(dataDir, "keystore.passphrase"), "utf8").trim();
  store = openStore(join(dataDir, "licensing.db"));
  store.sqlite.run("CREATE TABLE server_writes (at INTEGER)");
  app = createApp(buildDeps(store, openKeystore(dataDir, passphrase)), { baseUrl: BASE });
  productId = json(
    (await api("POST", "/mgmt/v1/products", { name: "Keys", code: "keys", environment: "live" })).bytes,
  ).data.public_id;
  const policy = json(
    (
      await api("POST", "/mgmt/v1/policies", {
        product_id: productId,
        name: "Hybrid",
        validation_mode: "hybrid",
        max_machines: 20,
        cert_ttl_sec: 7 * 86_400,
      })
    ).bytes,
  ).data;
  policyId = policy.public_id;
  // Offline packages default to the license's expiry: a year, far past the certificates' week.
  const expiresAt = new Date(Date.now() + 365 * 86_400_000).toISOString();
  licenseId = json(
    (
      await api("POST", "/mgmt/v1/licenses", {
        product_id: productId,
        policy_id: policy.public_id,
        expires_at: expiresAt,
      })
    ).bytes,
  ).data.public_id;
  config = json((await api("GET", `/mgmt/v1/products/${productId}/integration-config`)).bytes).data.config;
  rootPublicKey = config.trust_anchor.root_public_key;
});
afterAll(() => {
  store?.close();
  rmSync(work, { recursive: true, force: true });
});

describe("changing signing keys while the server writes", () => {
  test("a rotation takes effect whole: the new key is active and listed, the old one retired, the change audited", async () => {
    const before = await bundle();
    const oldKey = activeKey();
    const run = await whileServerWrites(["rotate", "--product", productId, "--json"]);
    expect(run.stderr).toBe("");
    expect(run.code).toBe(0);
    // The server did commit while the command ran, and was held off while it changed the keys.
    expect(run.writes.committed).toBeGreaterThan(0);
    expect(run.writes.refused).toBeGreaterThan(0);
    const { key_id: newKey, trust_bundle_sequence: sequence } = JSON.parse(run.stdout);
    expect(activeKey()).toBe(newKey);
    const after = await bundle();
    expect(after.sequence).toBe(sequence);
    expect(after.sequence).toBe(before.sequence + 1);
    // Both made within one second here: the bundle then orders them by key id.
    expect(after.signing_keys.map((k) => [k.key_id, k.status]).sort()).toEqual(
      [
        [oldKey, "retired"],
        [newKey, "active"],
      ].sort(),
    );
    expect(auditTypes()).toEqual(["signing_key.rotated"]);
  });

  test("marking a key compromised takes effect whole: the bundle lists it as compromised and the change is audited", async () => {
    const old = keyRows().find((k) => k.status === "retired")?.key_id as string;
    const before = await bundle();
    const run = await whileServerWrites(["retire", old, "--compromised"]);
    expect(run.stderr).toBe("");
    expect(run.code).toBe(0);
    expect(run.writes.refused).toBeGreaterThan(0);
    const after = await bundle();
    expect(after.sequence).toBe(before.sequence + 1);
    expect(after.signing_keys.find((k) => k.key_id === old)?.status).toBe("compromised");
    expect(auditTypes()).toEqual(["signing_key.rotated", "signing_key.compromised"]);
  });

  test("a rotation that fails part-way changes nothing: the same keys, the same bundle, no audit record", async () => {
    const keys = keyRows();
    const before = await bundle();
    const audits = auditTypes();
    const run = await whileServerWrites(["rotate", "--product", productId], { failUnderLock: true });
    expect(run.code).toBe(1);
    expect(run.stderr).toContain("simulated failure inside the change");
    expect(keyRows()).toEqual(keys);
    expect(await bundle()).toEqual(before);
    expect(auditTypes()).toEqual(audits);
  });

  test("the active key cannot be retired, and nothing changes", async () => {
    const keys = keyRows();
    const run = await cli(["retire", activeKey() as string]);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain("is the active key; rotate first");
    expect(keyRows()).toEqual(keys);
  });
});

describe("how long a retired key stays in the bundle", () => {
  const iso = (unix: number) => new Date(unix * 1000).toISOString().replace(".000Z", "Z");

  test("by default it stays listed until the last offline package it signed has expired, not just a certificate lifetime", async () => {
    const expiresAt = await offlinePackage();
    const run = await cli(["rotate", "--product", productId, "--json"]);
    expect(run.code).toBe(0);
    const { retired } = JSON.parse(run.stdout);
    expect(retired.not_after).toBeGreaterThanOrEqual(expiresAt);
    expect(retired.invalidated_offline_packages).toEqual({ count: 0, latest_expires_at: null });
  });

  test("rotate says how many unexpired offline packages keep the retired key listed, and until when", async () => {
    const expiresAt = Math.max(await offlinePackage(), await offlinePackage());
    const signer = activeKey() as string;
    const run = await cli(["rotate", "--product", productId]);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain(
      `Key ${signer} is retired and stays in the trust bundle until ${iso(expiresAt)}.\n` +
        "That is when the last of the 2 unexpired offline packages it signed expires (packages of revoked licenses do not count).",
    );
    // A key that signed none stays for the longest certificate, and says so.
    const again = await cli(["rotate", "--product", productId, "--json"]);
    const { retired } = JSON.parse(again.stdout);
    expect(retired.unexpired_offline_packages).toEqual({ count: 0, latest_expires_at: null });
  });

  test("a revoked license's offline package does not keep the retired key listed; a suspended one's does", async () => {
    expect((await cli(["rotate", "--product", productId])).code).toBe(0);
    const revoked = await newLicense(3 * 365);
    const revokedExpiry = await offlinePackage(revoked);
    expect((await api("DELETE", `/mgmt/v1/licenses/${revoked}`)).status).toBe(204);
    const before = Math.floor(Date.now() / 1000);
    const run = await cli(["rotate", "--product", productId, "--json"]);
    const after = Math.floor(Date.now() / 1000);
    const { retired } = JSON.parse(run.stdout);
    // The longest certificate (the policy's week, plus its three days of network grace: it fails
    // open), not the revoked license's three years.
    expect(retired.not_after).toBeGreaterThanOrEqual(before + 10 * 86_400);
    expect(retired.not_after).toBeLessThanOrEqual(after + 10 * 86_400);
    expect(retired.not_after).toBeLessThan(revokedExpiry);
    expect(retired.unexpired_offline_packages).toEqual({ count: 0, latest_expires_at: null });
    expect(retired.invalidated_offline_packages).toEqual({ count: 0, latest_expires_at: null });

    // A suspension can be lifted, and the package must then verify again.
    const suspended = await newLicense(2 * 365);
    const suspendedExpiry = await offlinePackage(suspended);
    const suspend = await api("PATCH", `/mgmt/v1/licenses/${suspended}`, { status_action: "suspended" });
    expect(suspend.status).toBe(200);
    const next = JSON.parse((await cli(["rotate", "--product", productId, "--json"])).stdout).retired;
    expect(next.not_after).toBe(suspendedExpiry);
    expect(next.unexpired_offline_packages).toEqual({ count: 1, latest_expires_at: suspendedExpiry });
  });

  test("a shorter --retain-days says how many unexpired offline packages it invalidates and until when they were valid", async () => {
    const latest = Math.max(await offlinePackage(), await offlinePackage());
    const signer = activeKey() as string;
    const run = await cli(["rotate", "--product", productId, "--retain-days", "1", "--json"]);
    expect(run.code).toBe(0);
    const { retired } = JSON.parse(run.stdout);
    expect(retired.key_id).toBe(signer);
    expect(retired.invalidated_offline_packages).toEqual({ count: 2, latest_expires_at: latest });

    const next = await offlinePackage();
    const text = await cli(["rotate", "--product", productId, "--retain-days", "0"]);
    expect(text.code).toBe(0);
    expect(text.stdout).toContain(
      `Warning: 1 unexpired offline package signed by ${activeKeyBefore(text.stdout)} is valid until ${iso(next)} at the latest`,
    );
  });

  test("a --retain-days shorter than a certificate's life with its network grace warns until when the certificates stay usable", async () => {
    const before = Math.floor(Date.now() / 1000);
    const json = await cli(["rotate", "--product", productId, "--retain-days", "8", "--json"]);
    const after = Math.floor(Date.now() / 1000);
    expect(json.code).toBe(0);
    const { retired } = JSON.parse(json.stdout);
    // The policy's week of certificate plus three days of grace (it fails open): past the 8 days.
    expect(retired.certificates_usable_until).toBeGreaterThanOrEqual(before + 10 * 86_400);
    expect(retired.certificates_usable_until).toBeLessThanOrEqual(after + 10 * 86_400);
    expect(retired.certificates_usable_until - retired.not_after).toBe(2 * 86_400);

    const text = await cli(["rotate", "--product", productId, "--retain-days", "8"]);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(
      new RegExp(
        `Warning: certificates signed by ${activeKeyBefore(text.stdout)} may stay usable until \\S+ \\(the longest cert_ttl_sec of the product's policies, plus network_grace_sec where a policy fails open\\)`,
      ),
    );
    // Ten days cover them: no warning.
    const enough = await cli(["rotate", "--product", productId, "--retain-days", "10"]);
    expect(enough.stdout).not.toContain("Warning: certificates");
  });

  test("list prints the key times as ISO dates, and --json keeps them as Unix seconds", async () => {
    const listed = JSON.parse((await cli(["list", "--product", productId, "--json"])).stdout) as {
      key_id: string;
      not_before: number;
      not_after: number | null;
    }[];
    const retired = listed.find((k) => k.not_after !== null);
    expect(typeof retired?.not_before).toBe("number");
    const table = (await cli(["list", "--product", productId])).stdout;
    const row = table.split("\n").find((line) => line.startsWith(retired?.key_id ?? "-"));
    expect(row).toContain(iso(retired?.not_before ?? 0));
    expect(row).toContain(iso(retired?.not_after ?? 0));
    expect(table).not.toMatch(/\s\d{10}\s/);
  });

  test("retiring a key at once says how many unexpired offline packages it signed", async () => {
    const expiresAt = await offlinePackage();
    const signer = activeKey() as string;
    expect((await cli(["rotate", "--product", productId])).code).toBe(0);
    const run = await cli(["retire", signer]);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain(`Key ${signer} retired`);
    expect(run.stdout).toContain(
      `1 unexpired offline package it signed (valid until ${iso(expiresAt)} at the latest)`,
    );
    expect((await bundle()).signing_keys.some((k) => k.key_id === signer)).toBe(false);
  });
});

describe("mistakes on the command line", () => {
  test("an extra argument is a usage error that changes nothing: rotate --product P 30 does not rotate with the default retention", async () => {
    const keys = keyRows();
    const before = await bundle();
    const audits = auditTypes();
    for (const [subcommand, extra] of [
      ["rotate", "30"],
      ["list", "extra"],
    ] as const) {
      const run = await cli([subcommand, "--product", productId, extra]);
      expect({ subcommand, ...run }).toEqual({
        subcommand,
        code: 2,
        stdout: "",
        stderr:
          `licensing signing-keys ${subcommand}: unexpected argument ${extra}\n` +
          `Run "licensing signing-keys ${subcommand} --help" for its options.\n`,
      });
    }
    expect(keyRows()).toEqual(keys);
    expect(await bundle()).toEqual(before);
    expect(auditTypes()).toEqual(audits);
  });

  test("retire of a key that is not a key id is a usage error", async () => {
    const run = await cli(["retire", "30"]);
    expect([run.code, run.stderr.split("\n")[0]]).toEqual([
      2,
      "licensing signing-keys retire: the key id must be k_ and 20 hex characters (see licensing signing-keys list)",
    ]);
  });

  test("a key already retired and out of the trust bundle is refused as already retired, with no new bundle or audit record", async () => {
    const signer = activeKey() as string;
    expect((await cli(["rotate", "--product", productId])).code).toBe(0);
    // Still listed after the rotation, so retiring it drops it from the bundle: a change.
    expect((await cli(["retire", signer])).code).toBe(0);
    const before = await bundle();
    const audits = auditTypes();
    const again = await cli(["retire", signer]);
    expect([again.code, again.stdout, again.stderr]).toEqual([
      1,
      "",
      `licensing signing-keys retire: ${signer} is already retired and out of the trust bundle\n`,
    ]);
    expect(await bundle()).toEqual(before);
    expect(auditTypes()).toEqual(audits);
  });
});

/** The retired key named by rotate's text output. */
const activeKeyBefore = (stdout: string) => /Key (k_\w+) is retired/.exec(stdout)?.[1];
