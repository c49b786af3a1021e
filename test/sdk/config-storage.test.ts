import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import {
  DEFAULT_TRUST_BUNDLE_MAX_UNCONFIRMED_MS,
  LicensingClient,
  LocalStorageAdapter,
  MAX_TRUST_BUNDLE_UNCONFIRMED_MS,
  MemoryStorage,
  resolveConfig,
  type WebStorageLike,
} from "../../src/sdk/index.ts";
import { ClientState } from "../../src/sdk/state.ts";
import { Authority, edKey, type Json } from "./support/authority.ts";
import { catchSdk } from "./support/expect.ts";
import { FakeServer } from "./support/fake-server.ts";
import { MACHINE } from "./support/setup.ts";

describe("integration config", () => {
  test("the live config trusts root_public_key and derives the API and bundle URLs", () => {
    const a = new Authority();
    const cfg = resolveConfig({ ...a.config(), api_url: "https://licensing.example.test/" });
    expect(cfg).toMatchObject({
      productId: a.productId,
      environment: "live",
      apiBase: "https://licensing.example.test",
      rootPublicKey: a.root.publicKey,
      rootKeyId: a.root.keyId,
      minimumBundleSequence: 1,
    });
    expect(cfg.trustBundleUrl).toBe(
      `https://licensing.example.test/runtime/v1/products/${a.productId}/trust-bundle`,
    );
  });

  test("the test config trusts development_root_public_key", () => {
    const a = new Authority();
    a.environment = "test";
    expect(resolveConfig(a.config()).rootPublicKey).toBe(a.devRoot.publicKey);
  });

  test("the management response wrapping the config under data.config is accepted as well", () => {
    const a = new Authority();
    const wrapped = { file_name: "service.config.json", content: "{}", config: a.config() };
    expect(resolveConfig(wrapped).productId).toBe(a.productId);
  });

  test("a key_id that does not belong to the environment's root key is refused", () => {
    const a = new Authority();
    const cfg = a.config();
    (cfg.trust_anchor as Json).key_id = edKey().keyId;
    expect(catchSdk(() => resolveConfig(cfg)).code).toBe("CONFIG_INVALID");
  });

  test("a config without the environment's root key cannot be used", () => {
    const a = new Authority();
    const cfg = a.config();
    Object.assign(cfg.trust_anchor as Json, {
      root_public_key: null,
      public_key_unavailable_reason: "signing_keys_pending",
    });
    const e = catchSdk(() => new LicensingClient({ config: cfg }));
    expect(e.code).toBe("TRUST_ANCHOR_UNAVAILABLE");
    expect(e.details.reason).toBe("signing_keys_pending");
  });

  test("malformed configs are refused with CONFIG_INVALID", () => {
    const a = new Authority();
    const bad: Json[] = [
      { ...a.config(), service_config_version: 2 },
      { ...a.config(), environment: "staging" },
      { ...a.config(), api_url: "ftp://x" },
      { ...a.config(), product: {} },
      { ...a.config(), trust_anchor: { ...(a.config().trust_anchor as Json), root_public_key: "p256:AAAA" } },
    ];
    for (const cfg of bad) expect(catchSdk(() => resolveConfig(cfg)).code).toBe("CONFIG_INVALID");
  });
});

describe("client options", () => {
  test("trustBundleMaxUnconfirmedMs takes whole milliseconds from 0 to 30 days; anything else is INVALID_ARGUMENT", () => {
    const config = new Authority().config();
    for (const ms of [0, 3_600_000, MAX_TRUST_BUNDLE_UNCONFIRMED_MS])
      expect(new LicensingClient({ config, trustBundleMaxUnconfirmedMs: ms })).toBeInstanceOf(
        LicensingClient,
      );
    expect(DEFAULT_TRUST_BUNDLE_MAX_UNCONFIRMED_MS).toBe(7 * 86_400_000);
    expect(MAX_TRUST_BUNDLE_UNCONFIRMED_MS).toBe(30 * 86_400_000);
    for (const ms of [
      -1,
      1.5,
      Number.NaN,
      Number.POSITIVE_INFINITY,
      MAX_TRUST_BUNDLE_UNCONFIRMED_MS + 1,
      "1000",
    ]) {
      const refused = catchSdk(
        () => new LicensingClient({ config, trustBundleMaxUnconfirmedMs: ms as number }),
      );
      expect(refused.code).toBe("INVALID_ARGUMENT");
    }
  });
});

describe("storage", () => {
  class FakeWebStorage implements WebStorageLike {
    items = new Map<string, string>();
    getItem(key: string) {
      return this.items.get(key) ?? null;
    }
    setItem(key: string, value: string) {
      this.items.set(key, value);
    }
    removeItem(key: string) {
      this.items.delete(key);
    }
  }

  test("the localStorage adapter stores strings under the client's prefix and removes them", async () => {
    const web = new FakeWebStorage();
    const adapter = new LocalStorageAdapter(web);
    await adapter.set("a", "1");
    expect(await adapter.get("a")).toBe("1");
    await adapter.delete("a");
    expect(await adapter.get("a")).toBeUndefined();

    const server = new FakeServer();
    const client = new LicensingClient({
      config: server.authority.config(),
      fetch: server.fetch,
      storage: adapter,
      now: () => 1_800_000_000_000,
    });
    await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
    const prefix = `svc.v1.live.${server.authority.productId}.`;
    expect([...web.items.keys()].sort()).toEqual(
      [
        "activation",
        "bundle",
        "bundle_sequence",
        "certificate",
        "device_keys",
        "local_high_water",
        "newest_answer",
        "time_high_water",
      ].map((k) => prefix + k),
    );
  });

  test("memory storage keeps values per key until deleted", async () => {
    const m = new MemoryStorage();
    await m.set("k", "v");
    expect(await m.get("k")).toBe("v");
    expect(m.keys()).toEqual(["k"]);
    await m.delete("k");
    expect(await m.get("k")).toBeUndefined();
  });

  test("concurrent first uses of the device keys generate one key pair", async () => {
    const server = new FakeServer();
    const storage = new MemoryStorage();
    const client = new LicensingClient({ config: server.authority.config(), fetch: server.fetch, storage });
    const [a, b] = await Promise.all([client.deviceKeys(), client.deviceKeys()]);
    expect(a.signing.publicKey).toBe(b.signing.publicKey);
    const again = new LicensingClient({ config: server.authority.config(), fetch: server.fetch, storage });
    expect((await again.deviceKeys()).signing.publicKey).toBe(a.signing.publicKey);
  });

  test("two raises of a one-way mark in flight on slow storage leave the higher value, whatever finishes last", async () => {
    const slow = new (class extends MemoryStorage {
      override async set(key: string, value: string) {
        await new Promise((resolve) => setTimeout(resolve, 5));
        return super.set(key, value);
      }
    })();
    const state = new ClientState(slow, "p.");
    await Promise.all([
      state.setTimeHighWater(5_000, { fresh: false }),
      state.setTimeHighWater(3_000, { fresh: false }),
    ]);
    expect(await state.timeHighWater()).toBe(5_000);
    await Promise.all([state.raiseBundleSequence(9), state.raiseBundleSequence(7)]);
    expect(await state.bundleSequence()).toBe(9);
  });
});

describe("portability", () => {
  test("the SDK source imports only its own files, @noble and @hpke/core, and uses no Node-only globals", () => {
    const dir = join(import.meta.dir, "../../src/sdk");
    const files = readdirSync(dir).filter((f) => f.endsWith(".ts"));
    expect(files.length).toBeGreaterThan(10);
    for (const file of files) {
      const code = readFileSync(join(dir, file), "utf8");
      const withoutComments = code.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
      for (const m of withoutComments.matchAll(/from\s+"([^"]+)"/g)) {
        expect([
          m[1],
          m[1]!.startsWith("./") || m[1]!.startsWith("@noble/") || m[1] === "@hpke/core",
        ]).toEqual([m[1], true]);
      }
      expect(withoutComments).not.toMatch(/\bBuffer\b|\bprocess\.|\brequire\(|node:/);
    }
  });

  test("every SDK source file stays under 400 lines", () => {
    const dir = join(import.meta.dir, "../../src/sdk");
    for (const file of readdirSync(dir)) {
      expect(readFileSync(join(dir, file), "utf8").split("\n").length).toBeLessThan(400);
    }
  });
});
