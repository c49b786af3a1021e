import { afterEach, describe, expect, test } from "bun:test";
import { deniedLocksRunUnlocked, type LockManagerLike } from "../../src/sdk/device-key-store.ts";
import { MemoryStorage } from "../../src/sdk/index.ts";
import { harness } from "./support/setup.ts";

/**
 * An opaque origin (a sandboxed iframe) has navigator.locks, but every request rejects with a
 * SecurityError before its callback runs. Nothing is shared there to take turns over, so the SDK
 * runs such a callback without the lock rather than failing with a raw DOMException.
 */
const securityError = () =>
  Object.assign(new Error("Access to the Locks API is denied in this context."), {
    name: "SecurityError",
  });
const denying: LockManagerLike = { request: () => Promise.reject(securityError()) };

describe("locks the platform denies", () => {
  test("run the callback without the lock, once, and answer its result", async () => {
    let runs = 0;
    const result = await deniedLocksRunUnlocked(denying).request("a", async () => {
      runs++;
      return 42;
    });
    expect([result, runs]).toEqual([42, 1]);
  });

  test("an error the callback throws is the callback's, SecurityError or not: never run again", async () => {
    let runs = 0;
    const granting: LockManagerLike = { request: (_name, callback) => callback() };
    const failing = deniedLocksRunUnlocked(granting).request("a", async () => {
      runs++;
      throw securityError();
    });
    await expect(failing).rejects.toThrow("denied");
    expect(runs).toBe(1);
  });

  test("any other refusal of the lock is passed on, and the callback is not run", async () => {
    let runs = 0;
    const aborting: LockManagerLike = {
      request: () => Promise.reject(Object.assign(new Error("aborted"), { name: "AbortError" })),
    };
    await expect(
      deniedLocksRunUnlocked(aborting).request("a", async () => {
        runs++;
      }),
    ).rejects.toThrow("aborted");
    expect(runs).toBe(0);
  });
});

describe("a client where navigator.locks denies every request", () => {
  const platform = globalThis as { navigator?: object };
  const had = platform.navigator !== undefined && Object.hasOwn(platform.navigator, "locks");
  afterEach(() => {
    if (!had && platform.navigator) Reflect.deleteProperty(platform.navigator, "locks");
  });

  test("makes its device keys and opens them again, instead of failing with the platform's error", async () => {
    if (!platform.navigator) platform.navigator = {};
    Object.defineProperty(platform.navigator, "locks", { value: denying, configurable: true });
    const h = harness({ storage: new MemoryStorage() });
    const keys = await h.client.deviceKeys();
    expect((await h.restart().deviceKeys()).signing.publicKey).toBe(keys.signing.publicKey);
  });
});
