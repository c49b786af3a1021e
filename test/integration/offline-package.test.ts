import { afterEach, beforeEach, describe, expect, spyOn, test } from "bun:test";
import { join } from "node:path";
import { zipSync } from "fflate";
import type { ChangeContext } from "../../src/deps.ts";
import { type PlanDefinition, planByCode } from "../../src/domain/plans.ts";
import { ApiError } from "../../src/http/errors.ts";
import { OfflinePackageService } from "../../src/modules/offline/service.ts";
import { TrustService } from "../../src/modules/trust/service.ts";
import { MemoryStorage, resolveConfig, SdkError, verifyOfflinePackage } from "../../src/sdk/index.ts";
import { readStoredZip } from "../../src/sdk/zip.ts";
import { buildDeps, openKeystore } from "../../src/server.ts";
import { createServices } from "../../src/services.ts";
import { openStore } from "../../src/store/db.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal, requestPackage, sdkClient } from "../support/offline.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/** The SDK's end-to-end check of an offline package: everything it must refuse, and what it keeps. */
let t: TestContext;
let fx: RuntimeFixture;
let config: Record<string, unknown>;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: {
      validation_mode: "hybrid",
      heartbeat_required: true,
      max_machines: 1,
      entitlements: { pro: true },
    },
  });
  config = await integrationConfig(t, fx.productId);
});
afterEach(() => t.close());

const ENTRIES = ["manifest.json", "manifest.sig", "license.jwt", "trust-bundle.json"] as const;

async function issued(app = sdkClient(t, config)) {
  const response = await requestPackage(
    t,
    fx.licenseId,
    await app.createOfflineRequest({ machineInfo: MACHINE }),
  );
  if (response.status !== 200) throw new Error(JSON.stringify(response.error));
  return { app, bytes: response.bytes };
}

/** The same archive with one entry's content replaced; still a well-formed stored ZIP. */
function replaced(
  bytes: Uint8Array,
  name: (typeof ENTRIES)[number],
  change: (text: string) => string,
): Uint8Array {
  const entries = readStoredZip(bytes, ENTRIES);
  const files: Record<string, [Uint8Array, { level: 0; mtime: Date }]> = {};
  for (const entry of ENTRIES) {
    const text = new TextDecoder().decode(entries.get(entry));
    files[entry] = [
      new TextEncoder().encode(entry === name ? change(text) : text),
      { level: 0, mtime: new Date(1980, 0, 1) },
    ];
  }
  return zipSync(files);
}

describe("tampering with any entry is refused", () => {
  const flipLast = (text: string) => `${text.slice(0, -2)}${text.at(-2) === "A" ? "B" : "A"}${text.at(-1)}`;
  test.each([
    [
      "manifest.json",
      (text: string) => text.replace(/"expires_at":(\d+)/, (_, n) => `"expires_at":${Number(n) + 86_400}`),
      "PACKAGE_SIGNATURE_INVALID",
    ],
    ["manifest.sig", flipLast, "PACKAGE_SIGNATURE_INVALID"],
    [
      "license.jwt",
      (text: string) => text.replace(/\.[^.]+$/, (sig) => flipLast(sig)),
      "PACKAGE_HASH_MISMATCH",
    ],
    [
      "trust-bundle.json",
      (text: string) => text.replace(/"sequence":(\d+)/, (_, n) => `"sequence":${Number(n) + 5}`),
      "BUNDLE_SIGNATURE_INVALID",
    ],
  ] as const)("a changed %s answers %s and nothing is stored", async (name, change, code) => {
    const { app, bytes } = await issued();
    const error = await refusal(app.loadOfflinePackage(replaced(bytes, name, change)));
    expect([error.kind, error.code]).toEqual(["verification", code]);
    expect(await app.activationId()).toBeUndefined();
    expect(await app.licenseState()).toBe("invalid");
  });

  test("a flipped byte anywhere in the archive is refused", async () => {
    const { app, bytes } = await issued();
    const keys = await app.deviceKeys();
    const opts = {
      config: resolveConfig(config),
      device: { signingPublicKey: keys.signing.publicKey, kemPublicKey: keys.kem.publicKey },
    };
    expect(verifyOfflinePackage(bytes, opts).manifest.license_id).toBe(fx.licenseId);
    for (let at = 0; at < bytes.length; at += 1) {
      const copy = bytes.slice();
      copy[at] = (copy[at] ?? 0) ^ 0x01;
      let refused = false;
      try {
        verifyOfflinePackage(copy, opts);
      } catch (error) {
        refused = error instanceof SdkError && error.kind === "verification";
      }
      expect(`${at}:${refused}`).toBe(`${at}:true`);
    }
  });

  test("an archive with an extra entry, a missing entry or a deflated entry is not a package", async () => {
    const { app, bytes } = await issued();
    const entries = readStoredZip(bytes, ENTRIES);
    const stored = (data: Uint8Array | undefined) =>
      [data ?? new Uint8Array(), { level: 0 as const }] as [Uint8Array, { level: 0 }];
    const all = Object.fromEntries(ENTRIES.map((name) => [name, stored(entries.get(name))]));
    const variants = [
      zipSync({ ...all, "extra.txt": stored(new Uint8Array([1])) }),
      zipSync(Object.fromEntries(ENTRIES.slice(1).map((name) => [name, stored(entries.get(name))]))),
      zipSync({ ...all, "license.jwt": [entries.get("license.jwt") ?? new Uint8Array(), { level: 6 }] }),
    ];
    for (const variant of variants)
      expect((await refusal(app.loadOfflinePackage(variant))).code).toBe("PACKAGE_INVALID");
  });
});

test("a manifest.json spelled otherwise than JCS is not a package, though its value and signature are intact", async () => {
  const { app, bytes } = await issued();
  // Rebuilt unchanged, the archive is the package: only the spelling differs below.
  expect(replaced(bytes, "manifest.json", (text) => text)).toEqual(new Uint8Array(bytes));
  const variants = [
    (text: string) => JSON.stringify(JSON.parse(text), null, 2),
    // A repeated member: JSON.parse keeps the last, the same value the signature covers.
    (text: string) => `{"expires_at":4102444800,${text.slice(1)}`,
  ];
  for (const change of variants) {
    const refused = await refusal(app.loadOfflinePackage(replaced(bytes, "manifest.json", change)));
    expect([refused.code, refused.message]).toEqual([
      "PACKAGE_INVALID",
      "manifest.json is not the JCS form of its value",
    ]);
  }
  expect(await app.activationId()).toBeUndefined();
});

test("the same four entries in another order are not a package, though every byte of each is intact", async () => {
  const { app, bytes } = await issued();
  const entries = readStoredZip(bytes, ENTRIES);
  const files = (order: readonly (typeof ENTRIES)[number][]) =>
    zipSync(
      Object.fromEntries(
        order.map((name) => [
          name,
          [entries.get(name) ?? new Uint8Array(), { level: 0 as const, mtime: new Date(1980, 0, 1) }],
        ]),
      ),
    );
  // Rebuilt in the protocol's order, the archive is the package again: only the order differs below.
  expect(files(ENTRIES)).toEqual(new Uint8Array(bytes));
  const swapped = files([ENTRIES[1], ENTRIES[0], ENTRIES[2], ENTRIES[3]]);
  const refused = await refusal(app.loadOfflinePackage(swapped));
  expect(refused.code).toBe("PACKAGE_INVALID");
  expect(refused.message).toContain("out of place");
});

describe("the package is bound to one device and one product", () => {
  test("another device's keys answer PACKAGE_DEVICE_MISMATCH", async () => {
    const { bytes } = await issued();
    expect((await refusal(sdkClient(t, config).loadOfflinePackage(bytes))).code).toBe(
      "PACKAGE_DEVICE_MISMATCH",
    );
  });

  test("an app configured for another product refuses the package's bundle", async () => {
    const { bytes } = await issued();
    const other = await runtimeFixture(t);
    const otherApp = sdkClient(t, await integrationConfig(t, other.productId));
    expect((await refusal(otherApp.loadOfflinePackage(bytes))).code).toBe("PRODUCT_MISMATCH");
  });

  test("an app configured for the test environment refuses a live package at its root key", async () => {
    const { bytes } = await issued();
    const test = await runtimeFixture(t, { key: t.keys.test });
    const testConfig = {
      ...(await integrationConfig(t, test.productId, t.keys.test)),
      product: { id: fx.productId },
    };
    expect((await refusal(sdkClient(t, testConfig).loadOfflinePackage(bytes))).code).toBe(
      "BUNDLE_ROOT_MISMATCH",
    );
  });
});

describe("what the SDK does with a verified package", () => {
  test("the license is valid until the package expires, then invalid; an earlier clock is clock tampering", async () => {
    const { app, bytes } = await issued();
    const info = await app.loadOfflinePackage(bytes, { machineInfo: MACHINE });
    expect(await app.licenseState()).toBe("valid");
    t.clock.advance(info.expiresAt - Math.floor(t.clock.now().getTime() / 1000));
    expect(await app.licenseState()).toBe("invalid");
    const behind = sdkClient(t, config);
    const late = await issued(behind);
    await behind.loadOfflinePackage(late.bytes);
    t.clock.advance(-3600);
    expect(await behind.licenseState()).toBe("clock_tampered");
  });

  test("an expired package is refused when loaded", async () => {
    const app = sdkClient(t, config);
    const request = await app.createOfflineRequest({ machineInfo: MACHINE });
    const response = await requestPackage(t, fx.licenseId, request, {
      expires_at: new Date(t.clock.now().getTime() + 3_600_000).toISOString(),
    });
    t.clock.advance(3601);
    expect((await refusal(app.loadOfflinePackage(response.bytes))).code).toBe("PACKAGE_EXPIRED");
  });

  test("a package issued before a key rotation still loads on a device that holds the newer bundle", async () => {
    const { app, bytes } = await issued();
    new TrustService(t.deps).rotate(fx.productId, { retainSec: 30 * 86_400 });
    const fresh = sdkClient(t, config);
    await fresh.setDeviceKeys(await app.deviceKeys());
    await fresh.trustBundle();
    await fresh.loadOfflinePackage(bytes, { machineInfo: MACHINE });
    expect((await fresh.trustBundle()).sequence).toBe(fx.bundle.sequence + 1);
    expect(await fresh.licenseState()).toBe("valid");
  });

  test("after a rotation with the default retention, a package that outlives its policy's certificate lifetime still loads on a device with the newer bundle", async () => {
    const { app, bytes } = await issued();
    const { expiresAt } = await app.loadOfflinePackage(bytes, { machineInfo: MACHINE });
    const ttl = t.deps.sqlite
      .query<{ ttl: number }, [string]>("SELECT max(cert_ttl_sec) AS ttl FROM policies WHERE product_id = ?")
      .get(fx.productId)?.ttl as number;
    // The package lives until the license's expiry (or the plan's longest license), far past this.
    expect(expiresAt).toBeGreaterThan(Math.floor(t.clock.now().getTime() / 1000) + ttl + 86_400);
    const trust = new TrustService(t.deps);
    const { retired } = trust.rotate(fx.productId);
    expect(retired?.not_after).toBeGreaterThanOrEqual(expiresAt);
    expect(retired?.invalidated_offline_packages).toEqual({ count: 0, latest_expires_at: null });
    t.clock.advance(ttl + 86_400);
    trust.pruneExpiredKeys(); // the sweeper's retired-keys step
    const fresh = sdkClient(t, config);
    await fresh.setDeviceKeys(await app.deviceKeys());
    expect((await fresh.trustBundle()).sequence).toBe(2);
    await fresh.loadOfflinePackage(bytes, { machineInfo: MACHINE });
    expect(await fresh.licenseState()).toBe("valid");
  });

  test("a package whose key was retired with a shorter retention stops at that key's not_after, on a device holding the newer bundle", async () => {
    const { app, bytes } = await issued();
    const { expiresAt } = await app.loadOfflinePackage(bytes, { machineInfo: MACHINE });
    const { retired } = new TrustService(t.deps).rotate(fx.productId, { retainSec: 86_400 });
    const notAfter = retired?.not_after as number;
    expect(expiresAt).toBeGreaterThan(notAfter);
    // A hybrid device online for a moment once its bundle is an hour old: it fetches the newer one.
    t.clock.advance(3_601);
    expect((await app.trustBundle()).sequence).toBe(fx.bundle.sequence + 1);
    expect(await app.licenseState()).toBe("valid");
    t.clock.advance(86_400 - 3_601 - 60);
    expect(await app.licenseState()).toBe("valid");
    t.clock.advance(61);
    const info = await app.licenseInfo();
    expect([info.state, info.reason]).toEqual(["invalid", "certificate_invalid"]);
  });

  describe("an app whose config asks for a newer bundle than the package's", () => {
    /** The config as downloaded after the product's bundle moved on past the package's. */
    const demanding = (minimum: number) => ({
      ...config,
      trust_anchor: {
        ...(config.trust_anchor as Record<string, unknown>),
        minimum_trust_bundle_sequence: minimum,
      },
    });

    test("loads the package on a device that holds a bundle at that minimum", async () => {
      const { app, bytes } = await issued();
      new TrustService(t.deps).rotate(fx.productId, { retainSec: 30 * 86_400 });
      const newer = sdkClient(t, demanding(fx.bundle.sequence + 1));
      await newer.setDeviceKeys(await app.deviceKeys());
      await newer.trustBundle();
      await newer.loadOfflinePackage(bytes, { machineInfo: MACHINE });
      expect(await newer.licenseState()).toBe("valid");
    });

    test("refuses the package's older bundle on a device that holds none", async () => {
      const { app, bytes } = await issued();
      new TrustService(t.deps).rotate(fx.productId, { retainSec: 30 * 86_400 });
      const newer = sdkClient(t, demanding(fx.bundle.sequence + 1));
      await newer.setDeviceKeys(await app.deviceKeys());
      const error = await refusal(newer.loadOfflinePackage(bytes, { machineInfo: MACHINE }));
      expect(error.code).toBe("BUNDLE_SEQUENCE_ROLLBACK");
      expect(await newer.activationId()).toBeUndefined();
    });
  });

  describe("a device that learned of a compromised key, and a package whose bundle still trusts it", () => {
    /** A package signed by the first key, then that key declared compromised and the device told. */
    async function compromisedSince(storage: MemoryStorage) {
      const { app, bytes } = await issued(sdkClient(t, config, { storage }));
      const trust = new TrustService(t.deps);
      const leaked = trust.signingKeys(fx.productId)[0]?.keyId as string;
      trust.rotate(fx.productId);
      trust.retire(leaked, { compromised: true });
      expect((await app.trustBundle()).sequence).toBe(3);
      return { app, bytes };
    }
    const bundleItem = () => `svc.v1.live.${fx.productId}.bundle`;

    test("refuses the package by the stored bundle-sequence floor when the stored bundle is gone", async () => {
      const storage = new MemoryStorage();
      const { app, bytes } = await compromisedSince(storage);
      // A crash between the two writes of a bundle leaves the floor and no bundle.
      await storage.delete(bundleItem());
      const restarted = sdkClient(t, config, { storage });
      const refused = await refusal(restarted.loadOfflinePackage(bytes, { machineInfo: MACHINE }));
      expect(refused.code).toBe("BUNDLE_SEQUENCE_ROLLBACK");
      expect(await restarted.activationId()).toBeUndefined();
      // The pure check takes the floor as well.
      const keys = await app.deviceKeys();
      const opts = {
        config: resolveConfig(config),
        device: { signingPublicKey: keys.signing.publicKey, kemPublicKey: keys.kem.publicKey },
      };
      expect(verifyOfflinePackage(bytes, opts).manifest.license_id).toBe(fx.licenseId);
      expect(() => verifyOfflinePackage(bytes, { ...opts, highestSequence: 3 })).toThrow(
        expect.objectContaining({ code: "BUNDLE_SEQUENCE_ROLLBACK" }),
      );
    });

    test("a storage adapter that fails to read the stored bundle is STORAGE_UNAVAILABLE, never taken for no bundle", async () => {
      let locked = false;
      const storage = new (class extends MemoryStorage {
        override async get(key: string) {
          if (locked && key === bundleItem()) throw new Error("EBUSY: the file is locked");
          return super.get(key);
        }
      })();
      const { bytes } = await compromisedSince(storage);
      const restarted = sdkClient(t, config, { storage });
      locked = true;
      const refused = await refusal(restarted.loadOfflinePackage(bytes, { machineInfo: MACHINE }));
      expect([refused.code, refused.kind]).toEqual(["STORAGE_UNAVAILABLE", "storage"]);
      locked = false;
      expect(await restarted.activationId()).toBeUndefined();
      expect((await refusal(restarted.loadOfflinePackage(bytes))).code).toBe("PACKAGE_SIGNATURE_INVALID");
    });
  });

  test("the license state of a device whose stored bundle cannot be read is STORAGE_UNAVAILABLE, not an invalid certificate", async () => {
    let locked = false;
    const storage = new (class extends MemoryStorage {
      override async get(key: string) {
        if (locked && key.endsWith(".bundle")) throw new Error("EBUSY: the file is locked");
        return super.get(key);
      }
    })();
    await sdkClient(t, config, { storage }).activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
    const restarted = sdkClient(t, config, { storage });
    locked = true;
    expect((await refusal(restarted.licenseInfo())).code).toBe("STORAGE_UNAVAILABLE");
    locked = false;
    expect(await restarted.licenseState()).toBe("valid");
  });

  test("a package's trust bundle is no confirmation from the service: online answers wait for a bundle refetch that succeeds", async () => {
    let bundleDown = true;
    const fetch = ((url: string, init?: RequestInit) =>
      bundleDown && url.includes("/trust-bundle")
        ? Promise.resolve(new Response('{"error":{"code":"INTERNAL","message":"down"}}', { status: 503 }))
        : t.app.handle(new Request(url, init))) as typeof globalThis.fetch;
    const { app, bytes } = await issued(sdkClient(t, config, { fetch }));
    await app.loadOfflinePackage(bytes);
    // The package may be months old when loaded, and its bundle with it.
    const refused = await refusal(app.heartbeat());
    expect(refused.code).toBe("BUNDLE_UNCONFIRMED");
    expect(refused.details.confirmed_at).toBeNull();
    expect(await app.licenseState()).toBe("valid");
    bundleDown = false;
    expect((await app.heartbeat()).licenseStatus).toBe("active");
  });

  test("a hybrid device holds its slot while its package lasts, and can later check in online", async () => {
    const { app, bytes } = await issued();
    await app.loadOfflinePackage(bytes);
    t.clock.advance(10 * 86_400);
    const online = sdkClient(t, config);
    const refused = await refusal(online.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE }));
    expect(refused.code).toBe("MACHINE_LIMIT_REACHED");
    const beat = await app.heartbeat();
    expect(beat.licenseStatus).toBe("active");
  });
});

test("a plan without offline packages answers 403 PLAN_ENTITLEMENT_REQUIRED naming the entitlement", async () => {
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const plan = (): PlanDefinition => ({ ...(planByCode("free") as PlanDefinition), features: [] });
  const offline = new OfflinePackageService(
    t.deps,
    services.trust,
    services.licenses,
    services.runtimeGate,
    services.activations,
    plan,
    BASE_URL,
  );
  const request = await sdkClient(t, config).createOfflineRequest({ machineInfo: MACHINE });
  const ctx: ChangeContext = { actor: { type: "system" }, environment: "live", requestId: null };
  let error: unknown;
  try {
    offline.issue(fx.licenseId, { request: request as never }, ctx);
  } catch (caught) {
    error = caught;
  }
  expect(error).toBeInstanceOf(ApiError);
  expect((error as ApiError).code).toBe("PLAN_ENTITLEMENT_REQUIRED");
  expect((error as ApiError).details).toEqual({ entitlement: "offline_packages" });
});

test("a package is signed by the key active when its write lock is held, even if another process rotated within the same turn", async () => {
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const offline = services.offlinePackages;
  const request = await sdkClient(t, config).createOfflineRequest({ machineInfo: MACHINE });
  const ctx: ChangeContext = { actor: { type: "system" }, environment: "live", requestId: null };
  // The command line's rotation, on its own connection and keystore copy, as `licensing
  // signing-keys rotate` does while the server runs.
  const cliStore = openStore(join(t.dir, "licensing.db"));
  try {
    const cli = buildDeps(cliStore, openKeystore(t.dir, "test passphrase"));
    // All in one turn of the event loop: the server has just used its key (a heartbeat), the
    // rotation commits, then the package is issued.
    const before = services.trust.signingKey(fx.productId).keyId;
    const rotation = new TrustService(cli).rotate(fx.productId);
    expect(rotation.retired?.key_id).toBe(before);
    const issued = offline.issue(fx.licenseId, { request: request as never }, ctx);
    const row = t.deps.sqlite
      .query<{ signing_key_id: string }, [string]>("SELECT signing_key_id FROM offline_packages WHERE id = ?")
      .get(issued.id);
    expect(row?.signing_key_id).toBe(rotation.key_id);
    const carried = readStoredZip(issued.bytes, ENTRIES).get("trust-bundle.json");
    expect(JSON.parse(new TextDecoder().decode(carried)).bundle.sequence).toBe(
      rotation.trust_bundle_sequence,
    );
  } finally {
    cliStore.close();
  }
});

test("an identical request after another process rotated the key within the same turn is not answered with the package the retired key signed", async () => {
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const request = await sdkClient(t, config).createOfflineRequest({ machineInfo: MACHINE });
  const ctx: ChangeContext = { actor: { type: "system" }, environment: "live", requestId: null };
  const cliStore = openStore(join(t.dir, "licensing.db"));
  try {
    const cli = buildDeps(cliStore, openKeystore(t.dir, "test passphrase"));
    // One turn of the event loop: the package, the command line's rotation, the same request again.
    const first = services.offlinePackages.issue(fx.licenseId, { request: request as never }, ctx);
    new TrustService(cli).rotate(fx.productId, { retainSec: 86_400 });
    let error: unknown;
    try {
      services.offlinePackages.issue(fx.licenseId, { request: request as never }, ctx);
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ApiError);
    expect((error as ApiError).code).toBe("OFFLINE_REQUEST_USED");
    expect((error as ApiError).details).toEqual({ reason: "signing_key_rotated", package_id: first.id });
  } finally {
    cliStore.close();
  }
});

test("a rotation finds the retiring key's unexpired packages by index, not by reading every package", async () => {
  const trust = new TrustService(t.deps);
  const { sql } = await sqlPreparedDuring(t.deps.sqlite, () => trust.rotate(fx.productId));
  const lookup = sql.find((text) => /FROM offline_packages p JOIN licenses l/.test(text));
  expect(lookup).toBeDefined();
  // Only the key's unexpired packages are read, each with its license (revoked ones do not count).
  const plan = queryPlan(t.deps.sqlite, (lookup as string).replaceAll("?", "'k'"));
  expect(plan).toContain(
    "SEARCH p USING INDEX offline_packages_signing_key (signing_key_id=? AND expires_at>?)",
  );
  expect(plan).toMatch(/SEARCH l USING (INDEX sqlite_autoindex_licenses_1|INTEGER PRIMARY KEY) \(/);
  expect(plan).not.toContain("SCAN");
});

type Cli = ReturnType<typeof createServices>;

describe("a change another process commits while the package waits for the write lock", () => {
  const ctx: ChangeContext = { actor: { type: "system" }, environment: "live", requestId: null };
  const inTwoDays = () => new Date(t.clock.now().getTime() + 2 * 86_400_000);

  /**
   * Issues a package while the command line, on its own connection, makes `change` at the last
   * moment it can: when issuing asks for the write lock (as a revoke that held the lock first
   * would commit just then). Whatever issuing read before that moment is out of date.
   */
  async function issueRacing(change: (cli: Cli) => void) {
    const request = await sdkClient(t, config).createOfflineRequest({ machineInfo: MACHINE });
    const services = createServices(t.deps, { baseUrl: BASE_URL });
    const cliStore = openStore(join(t.dir, "licensing.db"));
    const cli = createServices(buildDeps(cliStore, openKeystore(t.dir, "test passphrase")), {
      baseUrl: BASE_URL,
    });
    const db = t.deps.db;
    const transaction = db.transaction.bind(db);
    let changed = false;
    const spy = spyOn(db, "transaction").mockImplementation(((run, config) => {
      if (!changed && config?.behavior === "immediate") {
        changed = true;
        change(cli);
      }
      return transaction(run, config);
    }) as typeof db.transaction);
    try {
      return offlineOutcome(() =>
        services.offlinePackages.issue(fx.licenseId, { request: request as never }, ctx),
      );
    } finally {
      spy.mockRestore();
      cliStore.close();
      expect(changed).toBe(true);
    }
  }

  const offlineOutcome = (
    run: () => { bytes: Uint8Array },
  ): { bytes: Uint8Array; code: null } | { bytes: null; code: string } => {
    try {
      return { bytes: run().bytes, code: null };
    } catch (error) {
      if (error instanceof ApiError) return { bytes: null, code: error.code };
      throw error;
    }
  };
  const packageRows = () =>
    t.deps.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM offline_packages").get()?.n;

  test.each([
    ["a revoke", "LICENSE_REVOKED", (cli: Cli) => cli.licenses.revoke(fx.licenseId, undefined, ctx)],
    [
      "a suspension",
      "LICENSE_SUSPENDED",
      (cli: Cli) => cli.licenses.update(fx.licenseId, { status_action: "suspended" }, undefined, ctx),
    ],
    [
      "the product's archiving",
      "PRODUCT_ARCHIVED",
      (cli: Cli) => cli.products.archive(fx.productId, undefined, ctx),
    ],
    [
      "a policy turned online only",
      "OFFLINE_PACKAGE_NOT_ALLOWED",
      (cli: Cli) => cli.policies.update(fx.policyId, { validation_mode: "online" }, undefined, ctx),
    ],
  ])("%s is honoured: %s, and no package is stored", async (_change, code, change) => {
    const outcome = await issueRacing(change);
    expect(outcome.code).toBe(code);
    expect(packageRows()).toBe(0);
  });

  test("a shortened expiry is the package's: it never outlives the license as it is when issued", async () => {
    const shortened = inTwoDays();
    const outcome = await issueRacing((cli) =>
      cli.licenses.update(fx.licenseId, { expires_at: shortened.toISOString() }, undefined, ctx),
    );
    if (!outcome.bytes) throw new Error(`refused: ${outcome.code}`);
    const entries = readStoredZip(outcome.bytes, ENTRIES);
    const manifest = JSON.parse(new TextDecoder().decode(entries.get("manifest.json")));
    const jwt = new TextDecoder().decode(entries.get("license.jwt"));
    const claims = JSON.parse(Buffer.from(jwt.split(".")[1] ?? "", "base64url").toString());
    const second = Math.floor(shortened.getTime() / 1000);
    expect(manifest.expires_at).toBe(second);
    expect([claims.exp, claims.license.expires_at]).toEqual([second, second]);
  });
});
