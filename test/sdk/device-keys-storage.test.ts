import { describe, expect, test } from "bun:test";
import {
  exportDeviceKeys,
  generateDeviceKeys,
  MemoryStorage,
  type ResponseLike,
  type SdkError,
} from "../../src/sdk/index.ts";
import { rejectsSdk } from "./support/expect.ts";
import type { FakeServer } from "./support/fake-server.ts";
import { activated, type Harness, harness, MACHINE } from "./support/setup.ts";
import { FakeLocks } from "./support/shared-storage.ts";

/**
 * The stored activation is bound to the stored device keys, whoever writes storage: the app
 * clearing it under a running client ("sign out"), a second client on the same storage (a second
 * browser tab), or a storage write that fails half-way through an activation (a full quota).
 */
const PREFIX = "svc.v1.live.prod_01JTESTPRODUCT0000000000000.";
const LICENSE = { licenseKey: "LK-1234", machineInfo: MACHINE };

const outcome = (promise: Promise<unknown>) =>
  promise.then(
    () => "ok",
    (error: SdkError) => `${error.kind}/${error.code}`,
  );

async function clearStorage(storage: MemoryStorage): Promise<void> {
  for (const key of storage.keys()) await storage.delete(key);
}

async function storedPublicKey(storage: MemoryStorage): Promise<string | undefined> {
  const text = await storage.get(`${PREFIX}device_keys`);
  return text === undefined ? undefined : JSON.parse(text).signing.public_key;
}

/**
 * What a freshly loaded client (a reload) can do with what is stored: its keys must be the ones
 * the stored activation is bound to, so the heartbeat and the deactivation carry valid proofs.
 */
async function expectUsableAfterReload(h: Harness): Promise<void> {
  const activationId = JSON.parse((await h.storage.get(`${PREFIX}activation`)) ?? "{}").activation_id;
  expect(h.server.activations.get(activationId)?.publicKey).toBe(await storedPublicKey(h.storage));
  const reloaded = h.restart();
  expect(await reloaded.licenseState()).toBe("valid");
  expect(await outcome(reloaded.heartbeat())).toBe("ok");
  expect(await outcome(reloaded.deactivate())).toBe("ok");
  expect(h.server.activations.size).toBe(0);
  expect(h.server.proofFailures).toEqual([]);
}

/**
 * Holds each client's first activation answer until the test releases them, in the order it
 * chooses (a client's request made again after DEVICE_KEYS_CHANGED is answered at once).
 */
function holdActivationAnswers(h: Harness) {
  const held: { client: string; publicKey: string; release: () => void }[] = [];
  let arrived: () => void = () => undefined;
  const fetchFor =
    (client: string) =>
    async (url: string, init: Parameters<FakeServer["fetch"]>[1]): Promise<ResponseLike> => {
      const res = await h.server.fetch(url, init);
      if (init.method !== "POST" || !url.endsWith("/runtime/v1/activations")) return res;
      if (held.some((answer) => answer.client === client)) return res;
      const publicKey = JSON.parse(init.body ?? "{}").device_signing_public_key as string;
      await new Promise<void>((release) => {
        held.push({ client, publicKey, release });
        arrived();
      });
      return res;
    };
  const arrivals = (n: number) =>
    new Promise<void>((resolve) => {
      arrived = () => {
        if (held.length >= n) resolve();
      };
      arrived();
    });
  return { fetchFor, held, arrivals };
}

describe("the app clears its storage under a running client", () => {
  test("activating again in the same client writes its keys back, so the device works after a reload", async () => {
    const h = await activated();
    const first = await h.client.activationId();
    await clearStorage(h.storage);
    const again = await h.client.activate(LICENSE);
    // The same key pair: the server hands back the same activation and no second slot is taken.
    expect(again.activationId).toBe(first!);
    expect(h.server.activations.size).toBe(1);
    // The trust bundle held in memory is written back too, with its rollback floor.
    expect(await h.storage.get(`${PREFIX}bundle`)).toBeDefined();
    expect(await h.storage.get(`${PREFIX}bundle_sequence`)).toMatch(/^[1-9][0-9]*$/);
    await expectUsableAfterReload(h);
  });

  test("a client whose keys were replaced in storage by another client signs with the stored ones", async () => {
    const h = harness();
    const own = await h.client.deviceKeys();
    await clearStorage(h.storage);
    const other = await h.restart().deviceKeys();
    expect(other.signing.publicKey).not.toBe(own.signing.publicKey);
    await h.client.activate(LICENSE);
    const req = h.server.requests.find((r) => r.path === "/runtime/v1/activations")!;
    expect(req.json!.device_signing_public_key).toBe(other.signing.publicKey);
    expect((await h.client.deviceKeys()).signing.publicKey).toBe(other.signing.publicKey);
    await expectUsableAfterReload(h);
  });

  test("heartbeats after storage was cleared and refilled by another client carry the stored keys' proof", async () => {
    const h = await activated();
    // Another tab's client deactivates, the app clears storage, and that tab activates anew.
    const other = h.restart();
    await other.deactivate();
    await clearStorage(h.storage);
    const fresh = h.restart();
    await fresh.activate(LICENSE);
    expect(await outcome(h.client.heartbeat())).toBe("ok");
    expect(h.server.proofFailures).toEqual([]);
  });

  test("keys restored with setDeviceKeys are refused while activated, and otherwise become every client's keys", async () => {
    const h = await activated();
    const backup = generateDeviceKeys("p256");
    expect(await outcome(h.client.setDeviceKeys(backup))).toBe("usage/ALREADY_ACTIVATED");
    const other = h.restart();
    await other.deactivate();
    await h.client.setDeviceKeys(backup);
    expect((await other.deviceKeys()).signing.publicKey).toBe(backup.signing.publicKey);
    await other.activate(LICENSE);
    await expectUsableAfterReload(h);
  });

  test("keys deleted while the activation was in flight are written back with the activation", async () => {
    const h = harness();
    h.server.handlers.push((req) => {
      if (req.path === "/runtime/v1/activations") void h.storage.delete(`${PREFIX}device_keys`);
      return undefined;
    });
    const result = await h.client.activate(LICENSE);
    expect(await storedPublicKey(h.storage)).toBe(h.server.activations.get(result.activationId)?.publicKey);
    await expectUsableAfterReload(h);
  });
});

describe("another client on the same storage replaces the keys while an activation is in flight", () => {
  test("the activation is not stored, its server slot is released, and it is made once more with the stored keys", async () => {
    const h = harness();
    const own = (await h.client.deviceKeys()).signing.publicKey;
    const intruder = generateDeviceKeys();
    h.server.handlers.push((req) => {
      const activations = h.server.requests.filter((r) => r.path === "/runtime/v1/activations");
      if (req.path === "/runtime/v1/activations" && activations.length === 1)
        void h.storage.set(`${PREFIX}device_keys`, exportDeviceKeys(intruder));
      return undefined;
    });
    const result = await h.client.activate(LICENSE);
    // Released before the second request, so a license of one machine has its slot free for it.
    const calls = h.server.requests
      .filter((r) => r.path.startsWith("/runtime/v1/activations"))
      .map((r) => `${r.method} ${r.json?.device_signing_public_key ?? r.path}`);
    expect(calls).toEqual([
      `POST ${own}`,
      expect.stringMatching(/^DELETE \/runtime\/v1\/activations\/act_/),
      `POST ${intruder.signing.publicKey}`,
    ]);
    expect([...h.server.activations.keys()]).toEqual([result.activationId]);
    expect(await storedPublicKey(h.storage)).toBe(intruder.signing.publicKey);
    expect(h.server.proofFailures).toEqual([]);
    await expectUsableAfterReload(h);
  });

  test("keys replaced again while the second request is in flight refuse the call with DEVICE_KEYS_CHANGED, storing nothing and releasing both slots", async () => {
    const h = harness();
    const intruders: string[] = [];
    h.server.handlers.push((req) => {
      if (req.path !== "/runtime/v1/activations") return undefined;
      const keys = exportDeviceKeys(generateDeviceKeys());
      intruders.push(keys);
      void h.storage.set(`${PREFIX}device_keys`, keys);
      return undefined;
    });
    const error = await rejectsSdk(h.client.activate(LICENSE));
    expect(error).toMatchObject({ kind: "storage", code: "DEVICE_KEYS_CHANGED", retryable: true });
    expect(intruders).toHaveLength(2);
    expect(await h.client.activationId()).toBeUndefined();
    expect(await h.storage.get(`${PREFIX}certificate`)).toBeUndefined();
    expect(await h.storage.get(`${PREFIX}device_keys`)).toBe(intruders[1]);
    expect(h.server.requests.filter((r) => r.method === "DELETE")).toHaveLength(2);
    expect(h.server.activations.size).toBe(0);
    expect(h.server.proofFailures).toEqual([]);
  });

  test("the refusal stands when the orphan's release fails, and still stores nothing", async () => {
    const h = harness();
    h.server.handlers.push((req) => {
      if (req.path === "/runtime/v1/activations")
        void h.storage.set(`${PREFIX}device_keys`, exportDeviceKeys(generateDeviceKeys()));
      if (req.method === "DELETE") throw new Error("network down");
      return undefined;
    });
    expect(await outcome(h.client.activate(LICENSE))).toBe("storage/DEVICE_KEYS_CHANGED");
    expect(await h.client.activationId()).toBeUndefined();
  });

  test("stored keys that became unreadable while the activation was in flight refuse it as STORAGE_CORRUPT, storing nothing", async () => {
    const h = harness();
    h.server.handlers.push((req) => {
      if (req.path === "/runtime/v1/activations")
        void h.storage.set(`${PREFIX}device_keys`, '{"v":1,"signing');
      return undefined;
    });
    expect(await outcome(h.client.activate(LICENSE))).toBe("storage/STORAGE_CORRUPT");
    expect(await h.client.activationId()).toBeUndefined();
    expect(await h.storage.get(`${PREFIX}certificate`)).toBeUndefined();
  });
});

describe("two clients on one storage at first run (two browser tabs)", () => {
  test("without a lock manager, both end with one activation bound to the stored keys whichever answer comes last", async () => {
    for (const order of ["stored keys first", "other keys first"] as const) {
      const h = harness();
      const gate = holdActivationAnswers(h);
      const runs = new Map(
        ["tab1", "tab2"].map((tab) => [
          tab,
          outcome(h.restart({ fetch: gate.fetchFor(tab) }).activate(LICENSE)),
        ]),
      );
      await gate.arrivals(2);
      const stored = await storedPublicKey(h.storage);
      const [a, b] = gate.held;
      const storedFirst = a!.publicKey === stored ? [a!, b!] : [b!, a!];
      // One answer is taken in full before the other arrives: the later one is the last writer.
      for (const answer of order === "stored keys first" ? storedFirst : storedFirst.reverse()) {
        answer.release();
        await runs.get(answer.client);
      }
      // The client whose keys lost asks again with the stored ones and gets the same activation.
      expect(await Promise.all(runs.values())).toEqual(["ok", "ok"]);
      // An activation whose keys lost the race is given back; one device, one slot.
      expect(h.server.activations.size).toBe(1);
      await expectUsableAfterReload(h);
    }
  });

  test("with a lock manager, both generate under one lock name, share one key pair and one activation", async () => {
    const h = harness();
    const locks = new FakeLocks();
    const tab1 = h.restart({ locks });
    const tab2 = h.restart({ locks });
    const [r1, r2] = await Promise.all([tab1.activate(LICENSE), tab2.activate(LICENSE)]);
    expect(r1.activationId).toBe(r2.activationId);
    expect((await tab1.deviceKeys()).signing.publicKey).toBe((await tab2.deviceKeys()).signing.publicKey);
    expect(h.server.activations.size).toBe(1);
    expect(new Set(locks.names)).toEqual(new Set([`${PREFIX}device_keys`]));
    await expectUsableAfterReload(h);
  });

  test("with a lock manager, setDeviceKeys in one tab while another stores its activation is refused as ALREADY_ACTIVATED, keeping the activation's keys", async () => {
    const h = harness();
    const locks = new FakeLocks();
    let midActivation: (() => Promise<void>) | undefined;
    const storage = new (class extends MemoryStorage {
      override async set(key: string, value: string) {
        const run = midActivation;
        if (run && key === `${PREFIX}certificate`) {
          midActivation = undefined;
          await run();
        }
        return h.storage.set(key, value);
      }
      override get(key: string) {
        return h.storage.get(key);
      }
      override delete(key: string) {
        return h.storage.delete(key);
      }
    })();
    const tabA = h.restart({ locks, storage });
    const tabB = h.restart({ locks, storage });
    const kept = (await tabB.deviceKeys()).signing.publicKey;
    let restoring: Promise<string> = Promise.resolve("not started");
    // Tab B holds the lock, its activation checked against the stored keys and about to be
    // written, when tab A restores keys from a backup: A's check must wait for B's writes.
    midActivation = async () => {
      const requested = new Promise<void>((resolve) => {
        locks.onRequest = resolve;
      });
      restoring = outcome(tabA.setDeviceKeys(generateDeviceKeys("ed25519")));
      await requested;
    };
    await tabB.activate(LICENSE);
    expect(await restoring).toBe("usage/ALREADY_ACTIVATED");
    expect(await storedPublicKey(h.storage)).toBe(kept);
    await expectUsableAfterReload(h);
  });

  test("with a lock manager, a client that finds keys stored does not wait for the lock", async () => {
    const h = await activated();
    const locks = new FakeLocks();
    const tab = h.restart({ locks });
    await tab.heartbeat();
    await tab.deviceKeys();
    expect(locks.names).toEqual([]);
  });
});

describe("a storage write that fails during activation (a full quota)", () => {
  for (const item of ["certificate", "activation", "newest_answer", "denial", "last_heartbeat"]) {
    test(`a failed ${item} write leaves a state from which a retried activate() recovers the same activation`, async () => {
      const h = harness();
      let full = false;
      const storage = new (class extends MemoryStorage {
        override async set(key: string, value: string) {
          if (full && key === PREFIX + item) throw new Error("QuotaExceededError");
          return h.storage.set(key, value);
        }
        override async get(key: string) {
          return h.storage.get(key);
        }
        override async delete(key: string) {
          if (full && key === PREFIX + item) throw new Error("QuotaExceededError");
          return h.storage.delete(key);
        }
      })();
      const client = h.restart({ storage });
      await client.deviceKeys();
      full = true;
      expect(await outcome(client.activate(LICENSE))).toBe("storage/STORAGE_UNAVAILABLE");
      expect(await client.licenseState()).toBe("invalid");
      // Space is freed (the app drops its own data) and the user tries again, after a reload.
      full = false;
      const retried = await h.restart().activate(LICENSE);
      expect([...h.server.activations.keys()]).toEqual([retried.activationId]);
      await expectUsableAfterReload(h);
    });
  }
});
