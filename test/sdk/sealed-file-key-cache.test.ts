import { afterEach, beforeEach, expect, test } from "bun:test";
import {
  encryptChunk,
  newSealedHeader,
  parseSealingKeyLine,
  payloadKey,
  SEALED_MAGIC,
} from "../../src/crypto/sealed-file.ts";
import {
  DEFAULT_SEALED_FILE_KEY_CACHE_SIZE,
  LicensingClient,
  MAX_SEALED_FILE_KEY_CACHE_SIZE,
  MemoryStorage,
} from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";
import { FakeLocks } from "./support/shared-storage.ts";

/**
 * openSealedFile's cache of key answers: every answer survives opens that run at once, so each
 * file opens again with no network; and the cache keeps the most recently used answers only, so
 * what one open writes stays bounded however many files the device has opened.
 */
let t: TestContext;
let fx: RuntimeFixture;
let sealingKey: string;
let config: Record<string, unknown>;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, { policy: { max_machines: 10 } });
  sealingKey = (await t.call("POST", `/mgmt/v1/products/${fx.productId}/sealed-files`)).body.data.current_key
    .sealing_key;
  config = await integrationConfig(t, fx.productId);
});
afterEach(() => t.close());

/** A one-chunk sealed file, made in memory. */
async function sealedFile(content: number): Promise<Uint8Array> {
  const { line, dek, header } = await newSealedHeader(parseSealingKeyLine(sealingKey));
  const key = payloadKey(dek, Buffer.from(header.payload_salt, "base64url"));
  const body = encryptChunk(key, 0, true, new Uint8Array([content]));
  return new Uint8Array(Buffer.concat([Buffer.from(`${SEALED_MAGIC}${line}\n`), body]));
}

/** A client whose key requests can be cut off, counted, on storage that counts cache writes. */
async function device(options: { sealedFileKeyCacheSize?: number } = {}) {
  const storage = new MemoryStorage();
  const seen = { keyRequests: 0, cacheWrites: 0, largestCacheWrite: 0, online: true };
  const set = storage.set.bind(storage);
  storage.set = async (key, value) => {
    if (key.endsWith(".sealed_file_keys")) {
      seen.cacheWrites++;
      seen.largestCacheWrite = Math.max(seen.largestCacheWrite, value.length);
    }
    return set(key, value);
  };
  const app = new LicensingClient({
    config,
    storage,
    now: () => t.clock.now().getTime(),
    ...options,
    fetch: (async (url: string, init?: RequestInit) => {
      if (url.includes("/sealed-file-keys")) {
        seen.keyRequests++;
        if (!seen.online) throw new TypeError("network down");
      }
      return t.app.handle(new Request(url, init));
    }) as never,
  });
  await app.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  const cached = async () => {
    const text = await storage.get(`svc.v1.live.${fx.productId}.sealed_file_keys`);
    return Object.keys(JSON.parse(text ?? "{}"));
  };
  return { app, seen, cached, storage };
}

async function read(app: LicensingClient, file: Uint8Array): Promise<number[]> {
  return [...new Uint8Array(await new Response((await app.openSealedFile(file)).stream).arrayBuffer())];
}

test("files opened at once each keep their key answer, and all open again offline", async () => {
  const { app, seen, cached } = await device();
  const files = await Promise.all([0, 1, 2, 3, 4].map(sealedFile));
  expect(await Promise.all(files.map((file) => read(app, file)))).toEqual([[0], [1], [2], [3], [4]]);
  expect(await cached()).toHaveLength(5);

  seen.online = false;
  seen.keyRequests = 0;
  for (const [i, file] of files.entries()) expect(await read(app, file)).toEqual([i]);
  expect(seen.keyRequests).toBe(0);
});

test("the cache keeps the most recently used answers: a file in use stays while newer files push older ones out", async () => {
  const { app, seen, cached } = await device({ sealedFileKeyCacheSize: 4 });
  const files = await Promise.all([0, 1, 2, 3, 4, 5, 6].map(sealedFile));
  for (const file of files.slice(0, 4)) await read(app, file);
  // File 0 is the oldest; opened again it becomes the newest.
  await read(app, files[0] as Uint8Array);
  for (const file of files.slice(4)) await read(app, file);
  expect(await cached()).toHaveLength(4);

  seen.online = false;
  seen.keyRequests = 0;
  for (const i of [0, 4, 5, 6]) expect(await read(app, files[i] as Uint8Array)).toEqual([i]);
  expect(seen.keyRequests).toBe(0);
  // Files 1, 2 and 3 were pushed out: they need the service again.
  expect((await refusal(app.openSealedFile(files[1] as Uint8Array))).code).toBe("NETWORK_ERROR");
  expect(seen.keyRequests).toBe(1);
});

test("what one open writes stays bounded however many files were opened before", async () => {
  const { app, seen, cached } = await device({ sealedFileKeyCacheSize: 8 });
  for (let i = 0; i < 8; i++) await read(app, await sealedFile(i));
  const full = seen.largestCacheWrite;
  for (let i = 8; i < 40; i++) await read(app, await sealedFile(i));
  expect(await cached()).toHaveLength(8);
  // Answers differ in length by a few characters at most (base64url of fixed-size values).
  expect(seen.largestCacheWrite).toBeLessThan(full * 1.1);
});

test("opening a recently used file again writes nothing", async () => {
  const { app, seen } = await device({ sealedFileKeyCacheSize: 8 });
  const file = await sealedFile(7);
  await read(app, file);
  const writes = seen.cacheWrites;
  for (let i = 0; i < 5; i++) await read(app, file);
  expect(seen.cacheWrites).toBe(writes);
});

test("a cache size of 0 keeps no answers; a size out of range is refused", async () => {
  const { app, seen, cached } = await device({ sealedFileKeyCacheSize: 0 });
  const file = await sealedFile(1);
  await read(app, file);
  await read(app, file);
  expect(seen.keyRequests).toBe(2);
  expect(await cached()).toHaveLength(0);
  // No cache, no cache writes: not even an empty one at each open.
  expect(seen.cacheWrites).toBe(0);

  expect(DEFAULT_SEALED_FILE_KEY_CACHE_SIZE).toBe(256);
  for (const bad of [-1, 1.5, MAX_SEALED_FILE_KEY_CACHE_SIZE + 1, Number.NaN, "8"]) {
    const make = () =>
      new LicensingClient({
        config,
        sealedFileKeyCacheSize: bad as number,
        fetch: (() => undefined) as never,
      });
    expect(make).toThrow(expect.objectContaining({ code: "INVALID_ARGUMENT" }));
  }
});

test("a cache left from a larger size is neither used nor kept once the size is 0", async () => {
  const { app, seen, cached, storage } = await device();
  const file = await sealedFile(2);
  await read(app, file);
  expect(await cached()).toHaveLength(1);
  const uncached = new LicensingClient({
    config,
    storage,
    now: () => t.clock.now().getTime(),
    sealedFileKeyCacheSize: 0,
    fetch: (async (url: string, init?: RequestInit) => {
      if (url.includes("/sealed-file-keys")) seen.keyRequests++;
      return t.app.handle(new Request(url, init));
    }) as never,
  });
  seen.keyRequests = 0;
  expect(await read(uncached, file)).toEqual([2]);
  expect(seen.keyRequests).toBe(1);
  expect(await storage.get(`svc.v1.live.${fx.productId}.sealed_file_keys`)).toBeUndefined();
});

test("a cache that cannot be read counts as empty and is replaced, instead of failing every open", async () => {
  const { app, cached, storage } = await device();
  await storage.set(`svc.v1.live.${fx.productId}.sealed_file_keys`, "not json");
  expect(await read(app, await sealedFile(3))).toEqual([3]);
  expect(await cached()).toHaveLength(1);
});

test("without Web Crypto (a page outside a secure context) opening refuses as unavailable before asking the service", async () => {
  const { app, seen } = await device();
  const file = await sealedFile(7);
  const platform = globalThis.crypto;
  Object.defineProperty(globalThis, "crypto", {
    value: { getRandomValues: platform.getRandomValues.bind(platform) },
    configurable: true,
    writable: true,
  });
  let refused: unknown;
  try {
    await app.openSealedFile(file);
  } catch (error) {
    refused = error;
  } finally {
    Object.defineProperty(globalThis, "crypto", { value: platform, configurable: true, writable: true });
  }
  expect(refused).toMatchObject({ code: "CRYPTO_UNAVAILABLE", kind: "usage" });
  expect(seen.keyRequests).toBe(0);
  // With it back, the same file opens.
  expect(await read(app, file)).toEqual([7]);
});

test("two tabs on one storage that open different files at once each keep their answer: the cache changes in turn under the lock", async () => {
  const storage = new MemoryStorage();
  const locks = new FakeLocks();
  const cacheKey = `svc.v1.live.${fx.productId}.sealed_file_keys`;
  // Both key answers are held until both were asked for (each tab has looked in the cache by then).
  let asked = 0;
  let releaseBoth: () => void = () => undefined;
  const bothAsked = new Promise<void>((resolve) => {
    releaseBoth = resolve;
  });
  const fetch = async (url: string, init?: RequestInit) => {
    const response = await t.app.handle(new Request(url, init));
    if (url.includes("/sealed-file-keys")) {
      if (++asked === 2) releaseBoth();
      await bothAsked;
    }
    return response;
  };
  // Then the first tab to read the cache for its change waits until the other tab comes for it
  // too: by reading it (nothing makes them take turns) or by asking for the lock (something does).
  let changeReads = 0;
  let otherCame: () => void = () => undefined;
  const otherComes = new Promise<void>((resolve) => {
    otherCame = resolve;
  });
  locks.onRequest = () => {
    if (locks.names.filter((name) => name === cacheKey).length === 2) otherCame();
  };
  const get = storage.get.bind(storage);
  storage.get = async (key) => {
    if (key === cacheKey && asked === 2) {
      changeReads++;
      if (changeReads === 1) await otherComes;
      else otherCame();
    }
    return get(key);
  };
  const tab = () =>
    new LicensingClient({
      config,
      storage,
      locks,
      now: () => t.clock.now().getTime(),
      fetch: fetch as never,
    });
  const [tabA, tabB] = [tab(), tab()];
  await tabA.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
  const [first, second] = (await Promise.all([0, 1].map(sealedFile))) as [Uint8Array, Uint8Array];
  expect(await Promise.all([read(tabA, first), read(tabB, second)])).toEqual([[0], [1]]);
  expect(Object.keys(JSON.parse((await storage.get(cacheKey)) ?? "{}"))).toHaveLength(2);
});
