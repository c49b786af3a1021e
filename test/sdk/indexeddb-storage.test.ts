import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { IDBFactory } from "fake-indexeddb";
import { IndexedDbStorage, LocalStorageAdapter } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * The IndexedDB adapter, on fake-indexeddb (an implementation of the W3C spec; test/e2e/browser.test.ts
 * runs it in Chromium). Each instance is one tab's connection; the factory is the origin's store.
 */
let factory: IDBFactory;
beforeEach(() => {
  factory = new IDBFactory();
});

/** window.localStorage as far as the SDK uses it: items, and their keys by index. */
class FakeLocalStorage {
  readonly items = new Map<string, string>();
  get length() {
    return this.items.size;
  }
  key(index: number) {
    return [...this.items.keys()][index] ?? null;
  }
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

/** Opens a database with the given stores, as another script on the origin might have. */
function openRaw(name: string, stores: string[] = []): Promise<IDBDatabase> {
  return new Promise((resolve, reject) => {
    const request = factory.open(name, 1);
    request.onupgradeneeded = () => {
      for (const store of stores) request.result.createObjectStore(store);
    };
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

/**
 * The origin's factory, except that each open's success is held until `release()`: a browser
 * whose open stays pending (older Safari's first open of a page) and may answer much later.
 */
function heldFactory(): { factory: IDBFactory; release(): void } {
  const held: (() => void)[] = [];
  let releasing = false;
  const open = (name: string, version?: number): IDBOpenDBRequest => {
    const request = factory.open(name, version);
    return new Proxy(request, {
      get: (target, property) => Reflect.get(target, property, target),
      set: (target, property, value) => {
        if (property !== "onsuccess" || typeof value !== "function")
          return Reflect.set(target, property, value, target);
        target.onsuccess = (event) => {
          if (releasing) value.call(target, event);
          else held.push(() => value.call(target, event));
        };
        return true;
      },
    });
  };
  return {
    factory: { open } as unknown as IDBFactory,
    release() {
      releasing = true;
      for (const answer of held.splice(0)) answer();
    },
  };
}

/** Deletes the database; rejects when an open connection holds the deletion back. */
const deleteUnblocked = (name: string) =>
  new Promise<void>((resolve, reject) => {
    const deletion = factory.deleteDatabase(name);
    deletion.onsuccess = () => resolve();
    deletion.onerror = () => reject(deletion.error);
    deletion.onblocked = () => reject(new Error("the deletion was blocked by an open connection"));
  });

/** What an open came to: the storage's failure, "opened", or "still pending" once `ms` have passed. */
const outcomeWithin = (opening: Promise<unknown>, ms: number): Promise<unknown> =>
  Promise.race([
    opening.then(
      () => "opened",
      (error: Error) => error,
    ),
    new Promise<string>((resolve) => setTimeout(() => resolve("still pending"), ms)),
  ]);

describe("reads and writes", () => {
  test("a value set in one tab is read in another once set has resolved; delete removes it for both", async () => {
    const tabA = await IndexedDbStorage.open({ factory });
    const tabB = await IndexedDbStorage.open({ factory });
    expect(await tabB.get("svc.v1.device_keys")).toBeUndefined();
    await tabA.set("svc.v1.device_keys", '{"signing":"k1"}');
    expect(await tabB.get("svc.v1.device_keys")).toBe('{"signing":"k1"}');
    await tabB.set("svc.v1.device_keys", '{"signing":"k2"}');
    expect(await tabA.get("svc.v1.device_keys")).toBe('{"signing":"k2"}');
    await tabA.delete("svc.v1.device_keys");
    expect(await tabB.get("svc.v1.device_keys")).toBeUndefined();
  });

  test("databases of other names are other stores, and the data outlives the connection", async () => {
    const first = await IndexedDbStorage.open({ factory, name: "app-one" });
    const other = await IndexedDbStorage.open({ factory, name: "app-two" });
    await first.set("k", "one");
    expect(await other.get("k")).toBeUndefined();
    await first.close();
    const reopened = await IndexedDbStorage.open({ factory, name: "app-one" });
    expect(await reopened.get("k")).toBe("one");
    // A closed instance opens again at its next call.
    expect(await first.get("k")).toBe("one");
  });

  test("a value that is not a string, written by other code, reads as absent", async () => {
    const storage = await IndexedDbStorage.open({ factory });
    const raw = await openRaw("licensing-sdk");
    await new Promise<void>((resolve, reject) => {
      const transaction = raw.transaction("entries", "readwrite");
      transaction.objectStore("entries").put({ not: "a string" }, "svc.v1.activation");
      transaction.oncomplete = () => resolve();
      transaction.onerror = () => reject(transaction.error);
    });
    raw.close();
    expect(await storage.get("svc.v1.activation")).toBeUndefined();
  });
});

describe("failures", () => {
  test("a database of the same name without the SDK's store (another app's) is refused at open, saying so", async () => {
    (await openRaw("shared-name", ["something-else"])).close();
    await expect(IndexedDbStorage.open({ factory, name: "shared-name" })).rejects.toThrow(
      /shared-name.*no "entries" store/,
    );
  });

  test("a platform without IndexedDB is refused at open", async () => {
    const saved = (globalThis as { indexedDB?: unknown }).indexedDB;
    delete (globalThis as { indexedDB?: unknown }).indexedDB;
    try {
      await expect(IndexedDbStorage.open()).rejects.toThrow("IndexedDB is not available");
    } finally {
      if (saved !== undefined) (globalThis as { indexedDB?: unknown }).indexedDB = saved;
    }
  });

  test("an open the platform never answers fails after openTimeoutMs with a TimeoutError naming the database", async () => {
    const silent = { open: () => ({}) as IDBOpenDBRequest } as unknown as IDBFactory;
    const opening = IndexedDbStorage.open({ factory: silent, name: "stuck", openTimeoutMs: 50 });
    const outcome = await outcomeWithin(opening, 2000);
    expect(outcome).toBeInstanceOf(Error);
    expect((outcome as Error).name).toBe("TimeoutError");
    expect((outcome as Error).message).toContain('"stuck" within 50 ms');
  });

  test("an open answered after its timeout closes what it got, so nothing holds the database; opening again works", async () => {
    const slow = heldFactory();
    try {
      const opening = IndexedDbStorage.open({ factory: slow.factory, openTimeoutMs: 30 });
      const outcome = await outcomeWithin(opening, 2000);
      expect(outcome).toBeInstanceOf(Error);
      expect((outcome as Error).message).toContain("did not open");
    } finally {
      slow.release();
    }
    await deleteUnblocked("licensing-sdk");
    const storage = await IndexedDbStorage.open({ factory: slow.factory });
    await storage.set("k", "v");
    expect(await storage.get("k")).toBe("v");
  });

  test("an open timeout that is not a positive number is refused before anything opens", async () => {
    for (const openTimeoutMs of [0, -1, Number.NaN]) {
      await expect(IndexedDbStorage.open({ factory, openTimeoutMs })).rejects.toThrow(RangeError);
    }
  });

  test("site data cleared while a tab is open: the deletion is not blocked, and the tab's next write makes the store again", async () => {
    const storage = await IndexedDbStorage.open({ factory });
    await storage.set("k", "before");
    await new Promise<void>((resolve, reject) => {
      const deletion = factory.deleteDatabase("licensing-sdk");
      deletion.onsuccess = () => resolve();
      deletion.onerror = () => reject(deletion.error);
      // Left open, the tab's connection would hold the deletion back until the page closed.
      deletion.onblocked = () => reject(new Error("the deletion was blocked by the open tab"));
    });
    expect(await storage.get("k")).toBeUndefined();
    await storage.set("k", "after");
    expect(await (await IndexedDbStorage.open({ factory })).get("k")).toBe("after");
  });
});

describe("as the SDK's storage", () => {
  let t: TestContext;
  let fx: RuntimeFixture;
  let config: Record<string, unknown>;
  beforeEach(async () => {
    t = createTestContext();
    fx = await runtimeFixture(t, { policy: { validation_mode: "hybrid", max_machines: 1 } });
    config = await integrationConfig(t, fx.productId);
  });
  afterEach(() => t.close());

  test("a client activates on it, and a client of another tab on the same database is the same activated device", async () => {
    const tabA = sdkClient(t, config, { storage: await IndexedDbStorage.open({ factory }) });
    const activated = await tabA.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
    const tabB = sdkClient(t, config, { storage: await IndexedDbStorage.open({ factory }) });
    expect(await tabB.activationId()).toBe(activated.activationId);
    expect((await tabB.deviceKeys()).signing.publicKey).toBe((await tabA.deviceKeys()).signing.publicKey);
    expect(await tabB.licenseState()).toBe("valid");
  });

  test("an app moving from localStorage imports its entries once: the same device, still activated, on the same slot", async () => {
    const local = new FakeLocalStorage();
    local.setItem("unrelated.app.setting", "dark");
    const before = sdkClient(t, config, { storage: new LocalStorageAdapter(local) });
    const activated = await before.activate({ licenseKey: fx.licenseKey, machineInfo: MACHINE });
    const copied = [...local.items].filter(([key]) => key.startsWith("svc.v1."));

    const storage = await IndexedDbStorage.open({ factory, importFrom: local });
    const after = sdkClient(t, config, { storage });
    expect(await after.activationId()).toBe(activated.activationId);
    expect((await after.deviceKeys()).signing.publicKey).toBe((await before.deviceKeys()).signing.publicKey);
    expect(await after.licenseState()).toBe("valid");
    for (const [key, value] of copied) expect(await storage.get(key)).toBe(value);
    expect(await storage.get("unrelated.app.setting")).toBeUndefined();
    // localStorage is left as it was, for a tab still running the older app.
    expect(local.getItem("unrelated.app.setting")).toBe("dark");
    expect([...local.items].filter(([key]) => key.startsWith("svc.v1."))).toEqual(copied);
  });

  test("nothing is imported into a database that holds anything: what a tab wrote first stays", async () => {
    const local = new FakeLocalStorage();
    local.setItem("svc.v1.live.prod_x.device_keys", "from localStorage");
    const first = await IndexedDbStorage.open({ factory });
    await first.set("svc.v1.live.prod_x.device_keys", "written first");
    const second = await IndexedDbStorage.open({ factory, importFrom: local });
    expect(await second.get("svc.v1.live.prod_x.device_keys")).toBe("written first");
  });
});
