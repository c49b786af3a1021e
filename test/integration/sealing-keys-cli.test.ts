import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createApp } from "../../src/app.ts";
import { finishInit, initialise } from "../../src/cli/init.ts";
import { resolveConfig } from "../../src/config.ts";
import { Keystore } from "../../src/crypto/keystore.ts";
import { parseSealingKeyLine, sealFile } from "../../src/crypto/sealed-file.ts";
import type { Deps } from "../../src/deps.ts";
import { systemClock } from "../../src/domain/clock.ts";
import { silentLogger } from "../../src/http/logger.ts";
import { sweepOnce } from "../../src/jobs/sweeper.ts";
import { LicensingClient, MemoryStorage, SdkError } from "../../src/sdk/index.ts";
import { buildDeps, openKeystore } from "../../src/server.ts";
import { createServices } from "../../src/services.ts";
import { checkStore } from "../../src/store/backup.ts";
import { openStore, type Store } from "../../src/store/db.ts";
import { runInProcess } from "../support/in-process-cli.ts";
import { holdKeystoreLock } from "../support/keystore-lock.ts";
import { managementRequest } from "../support/management-request.ts";
import { MACHINE } from "../support/offline.ts";

/**
 * `licensing sealing-keys list|rotate|retire` through the real command-line entry point, on the
 * data dir of a server running in this process (its own store connection and keystore copy):
 * files are sealed by the tool and opened by the SDK through the real key-release route.
 */
const BASE = "http://licensing.test";
const work = mkdtempSync(join(tmpdir(), "sealing-keys-cli-"));
const dataDir = join(work, "data");
const keystorePath = join(dataDir, "keystore.json");
let store: Store;
let serverDeps: Deps;
let app: ReturnType<typeof createApp>;
let liveKey: string;
let passphrase: string;
let productId: string;
let plainProductId: string;
let licenseKey: string;
// biome-ignore lint/suspicious/noExplicitAny: the integration config is JSON from the API.
let config: any;

async function api(method: string, path: string, body?: unknown) {
  const response = await app.handle(managementRequest(BASE, liveKey, method, path, body));
  // biome-ignore lint/suspicious/noExplicitAny: JSON from the API.
  return { status: response.status, body: (await response.json()) as any };
}

const cli = (args: string[]) => runInProcess(["sealing-keys", ...args, "--data-dir", dataDir], work);
const status = async (id = productId) => (await api("GET", `/mgmt/v1/products/${id}/sealed-files`)).body.data;

/** The tool seals a fresh file to `line`; answers its bytes and plaintext. */
async function sealedTo(line: string) {
  const plain = new TextEncoder().encode(`sealed at ${Math.random()}`);
  const input = join(work, `in-${Math.random()}`);
  writeFileSync(input, plain);
  await sealFile(input, `${input}.sealed`, parseSealingKeyLine(line));
  return { file: new Uint8Array(readFileSync(`${input}.sealed`)), plain };
}

/** A new device (fresh activation, empty storage): it has no key answer kept from before. */
async function newDevice(): Promise<LicensingClient> {
  const device = new LicensingClient({
    config,
    storage: new MemoryStorage(),
    fetch: ((url: string, init?: RequestInit) => app.handle(new Request(url, init))) as never,
  });
  await device.activate({ licenseKey, machineInfo: MACHINE });
  return device;
}

async function opened(device: LicensingClient, file: Uint8Array): Promise<Uint8Array> {
  const result = await device.openSealedFile(file);
  return new Uint8Array(await new Response(result.stream).arrayBuffer());
}

/** The refusal's code and reason, as the device sees them. */
async function refusal(device: LicensingClient, file: Uint8Array): Promise<[string, unknown]> {
  try {
    await opened(device, file);
  } catch (error) {
    if (error instanceof SdkError) return [error.code, error.details.reason];
    throw error;
  }
  throw new Error("expected a refusal");
}

const keyRows = () =>
  store.sqlite
    .query<{ key_id: string; status: string; is_current: number; retired_at: number | null }, []>(
      "SELECT key_id, status, is_current, retired_at FROM sealing_keys ORDER BY rowid",
    )
    .all();
const auditRows = () =>
  store.sqlite
    .query<{ type: string; target_id: string; data: string }, []>(
      "SELECT type, target_id, data FROM audit_events WHERE type LIKE 'sealing_key.%' ORDER BY id",
    )
    .all();
const webhookEventTypes = () =>
  store.sqlite
    .query<{ type: string }, []>(
      "SELECT type FROM webhook_events WHERE type LIKE 'sealing_key.%' ORDER BY id",
    )
    .all()
    .map((row) => row.type);
/** The keystore file as a restarted server (or a backup) would read it. */
const keystoreFileHolds = (keyId: string) =>
  Keystore.open(keystorePath, passphrase).has(`product-sealing:${keyId}`);

beforeAll(async () => {
  const init = initialise(resolveConfig({ "data-dir": dataDir }, {}, work));
  // As `licensing init` does once the keys are shown: the staging folder and the lock go.
  finishInit(init);
  liveKey = init.apiKeys.live;
  passphrase = readFileSync(join(dataDir, "keystore.passphrase"), "utf8").trim();
  store = openStore(join(dataDir, "licensing.db"));
  serverDeps = buildDeps(store, openKeystore(dataDir, passphrase));
  app = createApp(serverDeps, { baseUrl: BASE });
  const product = async (code: string) =>
    (await api("POST", "/mgmt/v1/products", { name: code, code, environment: "live" })).body.data.public_id;
  productId = await product("sealed");
  plainProductId = await product("plain");
  const policy = (
    await api("POST", "/mgmt/v1/policies", { product_id: productId, name: "Seats", max_machines: 100 })
  ).body.data;
  licenseKey = (
    await api("POST", "/mgmt/v1/licenses", { product_id: productId, policy_id: policy.public_id })
  ).body.data.key;
  config = (await api("GET", `/mgmt/v1/products/${productId}/integration-config`)).body.data.config;
  const hook = await api("POST", "/mgmt/v1/webhooks", {
    url: "https://hooks.example.com/licensing",
    events: ["sealing_key.rotated", "sealing_key.retired", "sealing_key.compromised"],
  });
  expect(hook.status).toBe(201);
  expect((await api("POST", `/mgmt/v1/products/${productId}/sealed-files`)).status).toBe(200);
});
afterAll(() => {
  store?.close();
  rmSync(work, { recursive: true, force: true });
});

describe("the lifecycle of a product's sealing keys, with the server running", () => {
  let first: string;
  let second: string;
  let firstFile: Awaited<ReturnType<typeof sealedTo>>;
  let secondFile: Awaited<ReturnType<typeof sealedTo>>;

  test("rotate makes a new key current; files sealed to the old key and to the new one both open", async () => {
    const before = await status();
    first = before.current_key.key_id;
    firstFile = await sealedTo(before.current_key.sealing_key);
    const run = await cli(["rotate", "--product", productId, "--json"]);
    expect([run.code, run.stderr]).toEqual([0, ""]);
    const rotation = JSON.parse(run.stdout);
    second = rotation.key_id;
    expect(second).not.toBe(first);
    expect(rotation).toMatchObject({ previous_key_id: first, releasing_key_ids: [second, first] });

    // The running server shows the new current key, with no restart, and lists the old one as still active.
    const after = await status();
    expect(after.status).toBe("enabled");
    expect(after.current_key.key_id).toBe(second);
    expect(after.current_key.sealing_key).toBe(rotation.sealing_key);
    expect(
      after.keys.map((k: { key_id: string; status: string; current: boolean }) => [
        k.key_id,
        k.status,
        k.current,
      ]),
    ).toEqual([
      [second, "active", true],
      [first, "active", false],
    ]);
    secondFile = await sealedTo(after.current_key.sealing_key);
    const device = await newDevice();
    expect(await opened(device, firstFile.file)).toEqual(firstFile.plain);
    expect(await opened(device, secondFile.file)).toEqual(secondFile.plain);
    expect(auditRows().map((row) => [row.type, row.target_id, JSON.parse(row.data)])).toEqual([
      ["sealing_key.rotated", productId, { key_id: second, previous_key_id: first }],
    ]);
    expect(webhookEventTypes()).toEqual(["sealing_key.rotated"]);
  });

  test("list shows every key newest first, which one is current, and the public lines the status route shows", async () => {
    const run = await cli(["list", "--product", productId, "--json"]);
    expect(run.code).toBe(0);
    const listed = JSON.parse(run.stdout);
    const shown = (await status()).keys;
    expect(listed).toEqual(shown.map((k: object) => ({ ...k, private_key_held: true })));
    const text = await cli(["list", "--product", productId]);
    expect(text.stdout).toContain(`${second}  active (current)`);
    expect(text.stdout).toContain(
      `Seal new files to the current key: ${(await status()).current_key.sealing_key}`,
    );
  });

  test("the current key cannot be retired, with or without --compromised, and nothing changes", async () => {
    const rows = keyRows();
    for (const extra of [[], ["--compromised"]]) {
      const run = await cli(["retire", "--product", productId, "--key", second, ...extra]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(`${second} is the current sealing key of ${productId}; rotate first`);
    }
    expect(keyRows()).toEqual(rows);
    expect(keystoreFileHolds(second)).toBe(true);
    expect(auditRows()).toHaveLength(1);
  });

  test("retire refuses the old key's files as retired_key at once, keeps its private half, and new files keep opening", async () => {
    const device = await newDevice();
    const run = await cli(["retire", "--product", productId, "--key", first, "--json"]);
    expect([run.code, run.stderr]).toEqual([0, ""]);
    expect(JSON.parse(run.stdout)).toEqual({
      key_id: first,
      status: "retired",
      previous_status: "active",
      private_key_destroyed: false,
    });
    expect(await refusal(device, firstFile.file)).toEqual(["SEALED_FILE_INVALID", "retired_key"]);
    expect(await opened(device, secondFile.file)).toEqual(secondFile.plain);
    const shown = (await status()).keys.find((k: { key_id: string }) => k.key_id === first);
    expect(shown).toMatchObject({ status: "retired", current: false, retired_at: expect.any(String) });
    expect(keystoreFileHolds(first)).toBe(true);
    const again = await cli(["retire", "--product", productId, "--key", first]);
    expect([again.code, again.stderr.trim()]).toEqual([
      1,
      `licensing sealing-keys retire: ${first} is already retired`,
    ]);
  });

  test("a retired key declared compromised is refused as compromised_key and its private half leaves the keystore", async () => {
    const retiredAt = keyRows().find((k) => k.key_id === first)?.retired_at;
    const run = await cli(["retire", "--product", productId, "--key", first, "--compromised", "--json"]);
    expect([run.code, run.stderr]).toEqual([0, ""]);
    expect(JSON.parse(run.stdout)).toMatchObject({
      status: "compromised",
      previous_status: "retired",
      private_key_destroyed: true,
    });
    // It stopped releasing when it was retired: the compromise keeps that time.
    expect(keyRows().find((k) => k.key_id === first)).toMatchObject({
      status: "compromised",
      retired_at: retiredAt,
    });
    expect(keystoreFileHolds(first)).toBe(false);
    expect(keystoreFileHolds(second)).toBe(true);
    const device = await newDevice();
    expect(await refusal(device, firstFile.file)).toEqual(["SEALED_FILE_INVALID", "compromised_key"]);
    // The running server, having refused it, no longer holds the private half in memory either.
    expect(serverDeps.keystore.has(`product-sealing:${first}`)).toBe(false);
    expect(await opened(device, secondFile.file)).toEqual(secondFile.plain);
    const listed = JSON.parse((await cli(["list", "--product", productId, "--json"])).stdout);
    expect(listed.find((k: { key_id: string }) => k.key_id === first).private_key_held).toBe(false);
  });

  test("an active older key can be declared compromised directly, after a rotation away from it", async () => {
    const rotated = JSON.parse((await cli(["rotate", "--product", productId, "--json"])).stdout);
    const third = rotated.key_id;
    const thirdFile = await sealedTo(rotated.sealing_key);
    const run = await cli(["retire", "--product", productId, "--key", second, "--compromised", "--json"]);
    expect(run.code).toBe(0);
    expect(JSON.parse(run.stdout)).toMatchObject({ previous_status: "active", private_key_destroyed: true });
    expect(keystoreFileHolds(second)).toBe(false);
    const device = await newDevice();
    expect(await refusal(device, secondFile.file)).toEqual(["SEALED_FILE_INVALID", "compromised_key"]);
    expect(await opened(device, thirdFile.file)).toEqual(thirdFile.plain);
    expect((await status()).current_key.key_id).toBe(third);
    expect(auditRows().map((row) => [row.type, JSON.parse(row.data).key_id])).toEqual([
      ["sealing_key.rotated", second],
      ["sealing_key.retired", first],
      ["sealing_key.compromised", first],
      ["sealing_key.rotated", third],
      ["sealing_key.compromised", second],
    ]);
    expect(webhookEventTypes()).toEqual(auditRows().map((row) => row.type));
  });

  test("a compromise interrupted after its commit (private half still held) is completed by running it again", async () => {
    const interrupted = (await status()).current_key.key_id;
    expect((await cli(["rotate", "--product", productId])).code).toBe(0);
    // What a crash between the committed status and the keystore removal leaves behind.
    store.sqlite.run("UPDATE sealing_keys SET status = 'compromised', retired_at = 1 WHERE key_id = ?", [
      interrupted,
    ]);
    expect(keystoreFileHolds(interrupted)).toBe(true);
    const audits = auditRows().length;
    const run = await cli([
      "retire",
      "--product",
      productId,
      "--key",
      interrupted,
      "--compromised",
      "--json",
    ]);
    expect([run.code, run.stderr]).toEqual([0, ""]);
    expect(JSON.parse(run.stdout)).toMatchObject({
      previous_status: "compromised",
      private_key_destroyed: true,
    });
    expect(keystoreFileHolds(interrupted)).toBe(false);
    // The status change was audited when it committed; completing the removal is not a second one.
    expect(auditRows()).toHaveLength(audits);
    const done = await cli(["retire", "--product", productId, "--key", interrupted, "--compromised"]);
    expect([done.code, done.stderr.trim()]).toEqual([
      1,
      `licensing sealing-keys retire: ${interrupted} is already compromised`,
    ]);
  });

  test("a backup after a compromise passes its keystore check; an active key whose private half is missing still fails it", async () => {
    const run = await runInProcess(["backup", join(work, "backup"), "--data-dir", dataDir], work);
    expect(run.code).toBe(0);
    expect(run.stderr).not.toContain("lacks the private half");
    const current = (await status()).current_key.key_id;
    const missingCurrent = {
      has: (id: string) => id !== `product-sealing:${current}` && serverDeps.keystore.has(id),
    } as unknown as Keystore;
    expect(() => checkStore(store.sqlite, missingCurrent)).toThrow(`product-sealing:${current}`);
  });
});

describe("refusals change nothing", () => {
  const unchanged = async (args: string[], code: number, message: string) => {
    const rows = keyRows();
    const audits = auditRows().length;
    const run = await cli(args);
    expect({ code: run.code, stderr: run.stderr.split("\n")[0] }).toEqual({
      code,
      stderr: `licensing sealing-keys ${args[0]}: ${message}`,
    });
    expect(keyRows()).toEqual(rows);
    expect(auditRows()).toHaveLength(audits);
  };

  test("a missing --product or --key, or a malformed key id, is a usage error (exit 2)", async () => {
    await unchanged(["rotate"], 2, "--product is required");
    await unchanged(["list"], 2, "--product is required");
    await unchanged(
      ["retire", "--product", productId],
      2,
      "--key is required (see licensing sealing-keys list)",
    );
    await unchanged(
      ["retire", "--product", productId, "--key", "k_nothex"],
      2,
      "--key k_nothex is not a key id (k_ and 20 hex characters)",
    );
    await unchanged(["rotate", "--product", productId, "extra"], 2, "unexpected argument extra");
  });

  test("an unknown product, an unknown key, or a key of another product is a clear error (exit 1)", async () => {
    const current = (await status()).current_key.key_id;
    await unchanged(
      ["rotate", "--product", "prod_00000000000000000000000000"],
      1,
      "no product prod_00000000000000000000000000",
    );
    await unchanged(
      ["retire", "--product", productId, "--key", "k_00000000000000000000"],
      1,
      "no sealing key k_00000000000000000000 (see licensing sealing-keys list)",
    );
    await unchanged(
      ["retire", "--product", plainProductId, "--key", current],
      1,
      `sealing key ${current} belongs to ${productId}, not ${plainProductId}`,
    );
  });

  test("a product without sealed files has no key to rotate", async () => {
    const before = readFileSync(keystorePath, "utf8");
    await unchanged(
      ["rotate", "--product", plainProductId],
      1,
      `sealed files are not enabled for ${plainProductId}, so it has no sealing key to rotate; enable them first (POST /mgmt/v1/products/${plainProductId}/sealed-files)`,
    );
    // Refused before a key pair was made: the keystore did not gain an unused entry.
    expect(readFileSync(keystorePath, "utf8")).toBe(before);
    expect((await status(plainProductId)).status).toBe("disabled");
  });

  test("list on a product without sealed files says how to enable them", async () => {
    const run = await cli(["list", "--product", plainProductId]);
    expect(run.code).toBe(0);
    expect(run.stdout).toBe(
      `${plainProductId} has no sealing key: sealed files are not enabled for it ` +
        `(enable them with POST /mgmt/v1/products/${plainProductId}/sealed-files).\n`,
    );
  });

  test("a compromise without the right passphrase is refused before anything changes (exit 1): the key stays active and keeps its private half", async () => {
    const older = (await status()).current_key;
    const olderFile = await sealedTo(older.sealing_key);
    expect((await cli(["rotate", "--product", productId])).code).toBe(0);
    const keystore = readFileSync(keystorePath, "utf8");
    const retire = ["retire", "--product", productId, "--key", older.key_id, "--compromised"];

    const wrong = join(work, "wrong.passphrase");
    writeFileSync(wrong, "not the passphrase\n", { mode: 0o600 });
    await unchanged(
      [...retire, "--passphrase-file", wrong],
      1,
      "cannot open the keystore: the keystore passphrase is wrong",
    );
    const passphraseFile = join(dataDir, "keystore.passphrase");
    renameSync(passphraseFile, `${passphraseFile}.away`);
    try {
      await unchanged(
        retire,
        1,
        `no keystore passphrase: ${passphraseFile} does not exist; give --passphrase-file, ` +
          "LICENSING_KEYSTORE_PASSPHRASE_FILE or LICENSING_KEYSTORE_PASSPHRASE",
      );
      // No passphrase was made up for the keystore in its place.
      expect(existsSync(passphraseFile)).toBe(false);
    } finally {
      renameSync(`${passphraseFile}.away`, passphraseFile);
    }
    expect(readFileSync(keystorePath, "utf8")).toBe(keystore);
    expect(keyRows().find((k) => k.key_id === older.key_id)?.status).toBe("active");
    expect(await opened(await newDevice(), olderFile.file)).toEqual(olderFile.plain);
  });

  test("a rotation that fails inside its transaction leaves the keys, the current key and the audit log as they were", async () => {
    const rows = keyRows();
    const audits = auditRows().length;
    const entries = Keystore.open(keystorePath, passphrase).entries().length;
    const now = systemClock.now;
    let reads = 0;
    // The clock is read once to make the key pair (before the transaction), next for the audit record inside it.
    systemClock.now = () => {
      reads++;
      if (reads === 2) throw new Error("simulated failure inside the change");
      return now();
    };
    try {
      const run = await cli(["rotate", "--product", productId]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain("simulated failure inside the change");
    } finally {
      systemClock.now = now;
    }
    // The key pair was made (keystore first), so the failure did fall inside the transaction:
    // its private half stays unused, and no row names it.
    expect(Keystore.open(keystorePath, passphrase).entries().length).toBe(entries + 1);
    expect(keyRows()).toEqual(rows);
    expect(auditRows()).toHaveLength(audits);
    expect((await status()).keys.filter((k: { current: boolean }) => k.current)).toHaveLength(1);
  });
});

describe("a compromise whose keystore removal cannot happen", () => {
  test("with the keystore locked by another process past the wait, the compromise commits and exits 1 telling to run it again; the key is refused as compromised and keeps its private half until the server's sweep removes it", async () => {
    // A server process that started before the key below was made: it has never read that key.
    const running = buildDeps(store, openKeystore(dataDir, passphrase));
    const rotated = JSON.parse((await cli(["rotate", "--product", productId, "--json"])).stdout);
    const target: string = rotated.key_id;
    const file = await sealedTo(rotated.sealing_key);
    expect((await cli(["rotate", "--product", productId])).code).toBe(0);
    const others = keyRows().filter((k) => k.key_id !== target);
    const audits = auditRows().length;

    // Held by a process that does not let go.
    const lock = `${keystorePath}.lock`;
    const release = holdKeystoreLock(keystorePath);
    let run: Awaited<ReturnType<typeof cli>>;
    try {
      run = await cli(["retire", "--product", productId, "--key", target, "--compromised", "--json"]);
    } finally {
      release();
    }
    expect(run).toEqual({
      code: 1,
      stdout: "",
      stderr:
        `licensing sealing-keys retire: ${target} is compromised and releases no data keys, but its ` +
        `private half could not be removed from the keystore (the keystore is locked by another ` +
        `process (${lock})); run the command again\n`,
    });

    // The store: the compromise committed, audited and announced, before the removal was tried.
    expect(keyRows().find((k) => k.key_id === target)).toMatchObject({
      status: "compromised",
      is_current: 0,
      retired_at: expect.any(Number),
    });
    expect(keyRows().filter((k) => k.key_id !== target)).toEqual(others);
    expect(
      auditRows()
        .slice(audits)
        .map((row) => [row.type, JSON.parse(row.data)]),
    ).toEqual([["sealing_key.compromised", { key_id: target, previous_status: "active" }]]);
    expect(webhookEventTypes().at(-1)).toBe("sealing_key.compromised");
    // The keystore: the private half is still there, but no device gets a data key from it.
    expect(keystoreFileHolds(target)).toBe(true);
    expect(await refusal(await newDevice(), file.file)).toEqual(["SEALED_FILE_INVALID", "compromised_key"]);
    const listed = JSON.parse((await cli(["list", "--product", productId, "--json"])).stdout);
    expect(listed.find((k: { key_id: string }) => k.key_id === target)).toMatchObject({
      status: "compromised",
      private_key_held: true,
    });

    // The running server's next sweep finishes the removal.
    expect(sweepOnce(createServices(running, { baseUrl: BASE }), silentLogger).compromised_sealing_keys).toBe(
      1,
    );
    expect(keystoreFileHolds(target)).toBe(false);
    expect(running.keystore.has(`product-sealing:${target}`)).toBe(false);
    const done = await cli(["retire", "--product", productId, "--key", target, "--compromised"]);
    expect([done.code, done.stderr.trim()]).toEqual([
      1,
      `licensing sealing-keys retire: ${target} is already compromised`,
    ]);
  }, 30_000);
});
