import { describe, expect, test } from "bun:test";
import { LicensingClient, MemoryStorage, type SdkError } from "../../src/sdk/index.ts";
import { T0 } from "./support/authority.ts";
import { FakeServer } from "./support/fake-server.ts";
import { activated, MACHINE } from "./support/setup.ts";

/**
 * Storage the client cannot fully trust: an item torn by a crash, mangled by another app version,
 * or an adapter that throws. A mark that cannot be read counts as none (deleting it would do the
 * same) and the next verified answer replaces it; nothing of this stops the client for good, and
 * whatever goes wrong reaches the app as an SdkError.
 */
const PREFIX = "svc.v1.live.prod_01JTESTPRODUCT0000000000000.";

const failure = (promise: Promise<unknown>) =>
  promise.then(
    () => "ok",
    (error: SdkError) => `${error.kind}/${error.code}`,
  );

describe("unreadable marks", () => {
  for (const item of ["time_high_water", "local_high_water", "bundle_sequence", "newest_answer"]) {
    test(`an unreadable ${item} is replaced by the next verified answer, and heartbeats and deactivation go on`, async () => {
      const h = await activated();
      await h.storage.set(PREFIX + item, "1800000000x");
      const client = h.restart();
      // Two hours on: the heartbeat also refetches the trust bundle, which writes its sequence.
      h.server.serverTime += 7_200;
      h.clock.ms += 7_200_000;
      expect(await failure(client.heartbeat())).toBe("ok");
      const stored = await h.storage.get(PREFIX + item);
      expect(stored).toMatch(/^[0-9]+$/);
      expect(await client.licenseState()).toBe("valid");
      expect(await failure(client.deactivate())).toBe("ok");
      expect(h.server.requests.filter((r) => r.method === "DELETE")).toHaveLength(1);
    });
  }

  test("a mark in another notation (hex, exponent, sign, blank) is unreadable, not a number", async () => {
    const h = await activated();
    for (const text of ["0x10", "1e3", "-1", "", " ", "1.5"]) {
      await h.storage.set(`${PREFIX}time_high_water`, text);
      // Read as none: the first verified answer writes the server's time over it.
      await h.restart().serverTime();
      expect(await h.storage.get(`${PREFIX}time_high_water`)).toBe(String(T0));
    }
  });
});

describe("an unreadable denial or last answer", () => {
  test("a heartbeat over an unreadable denial succeeds and replaces it; licenseInfo reports it as corrupt until then", async () => {
    const h = await activated();
    await h.storage.set(`${PREFIX}denial`, '{"code":"LICENSE_REV');
    const client = h.restart();
    expect(await failure(client.licenseInfo())).toBe("storage/STORAGE_CORRUPT");
    h.server.serverTime += 5;
    expect(await failure(client.heartbeat())).toBe("ok");
    expect(await h.storage.get(`${PREFIX}denial`)).toBeUndefined();
    expect(await client.licenseState()).toBe("valid");
  });

  test("a lease call's signed revocation is recorded over an unreadable newest_answer, and the heartbeat that follows fails with it", async () => {
    const h = await activated();
    await h.storage.set(`${PREFIX}newest_answer`, "x");
    h.server.serverTime += 5;
    h.server.handlers.push((req) =>
      req.path.startsWith("/runtime/v1/leases") ? h.server.denial(req, 403, "LICENSE_REVOKED") : undefined,
    );
    const client = h.restart();
    expect(await failure(client.acquireLease("i1"))).toBe("license/LICENSE_REVOKED");
    expect(await client.licenseInfo()).toMatchObject({ state: "invalid", reason: "revoked" });
  });
});

describe("a torn last heartbeat", () => {
  test("the loop starts at once over an unreadable last_heartbeat, and its first heartbeat replaces it", async () => {
    const h = await activated();
    await h.storage.set(`${PREFIX}last_heartbeat`, '{"license_status":"act');
    const client = h.restart();
    await client.startHeartbeatLoop();
    expect(h.timer.pending()).toEqual([0]);
    await h.timer.runNext();
    expect(JSON.parse((await h.storage.get(`${PREFIX}last_heartbeat`)) ?? "{}").license_status).toBe(
      "active",
    );
    expect(await client.licenseState()).toBe("valid");
    client.stop();
  });
});

describe("the verified time", () => {
  test("a time the server signed a year ahead (a clock glitch) is forgiven at the next answer to this device's own request", async () => {
    const h = await activated();
    const glitch = T0 + 365 * 86_400;
    h.server.serverTime = glitch;
    h.server.sign = () => ({ delegation: { issued_at: glitch - 3600, expires_at: glitch + 3600 } });
    await h.client.serverTime().catch(() => undefined);
    expect(await h.storage.get(`${PREFIX}time_high_water`)).toBe(String(glitch));
    expect(await h.client.licenseState()).toBe("clock_tampered");
    h.server.serverTime = T0 + 10;
    h.server.sign = () => ({});
    h.clock.ms = (T0 + 10) * 1000;
    await h.client.heartbeat();
    expect(await h.storage.get(`${PREFIX}time_high_water`)).toBe(String(T0 + 10));
    expect(await h.client.licenseState()).toBe("valid");
  });
});

describe("the storage adapter", () => {
  test("an adapter that throws (a full quota) reaches the app as STORAGE_UNAVAILABLE, with the adapter's error as the cause", async () => {
    const server = new FakeServer();
    const quota = new Error("QuotaExceededError");
    const full = new (class extends MemoryStorage {
      override async set(key: string, value: string) {
        if (key.endsWith(".certificate")) throw quota;
        return super.set(key, value);
      }
    })();
    const client = new LicensingClient({
      config: server.authority.config(),
      fetch: (url, init) => server.fetch(url, init),
      storage: full,
      now: () => T0 * 1000,
    });
    const error = await client.activate({ licenseKey: "LK-1234", machineInfo: MACHINE }).then(
      () => undefined,
      (e: SdkError) => e,
    );
    expect(error).toMatchObject({ name: "SdkError", kind: "storage", code: "STORAGE_UNAVAILABLE" });
    expect(error?.message).toContain("certificate");
    expect(error?.cause).toBe(quota);
  });

  test("storage that refuses every write (a full quota) still answers the license questions, on a device never activated and on an activated one", async () => {
    const server = new FakeServer();
    const quota = new Error("QuotaExceededError");
    let full = false;
    const storage = new (class extends MemoryStorage {
      override async set(key: string, value: string) {
        if (full) throw quota;
        return super.set(key, value);
      }
    })();
    const client = new LicensingClient({
      config: server.authority.config(),
      fetch: (url, init) => server.fetch(url, init),
      storage,
      now: () => T0 * 1000,
    });
    full = true;
    expect(await client.licenseState()).toBe("invalid");
    expect(await client.hasEntitlement("pro")).toBe(false);
    full = false;
    await client.activate({ licenseKey: "LK-1234", machineInfo: MACHINE });
    full = true;
    expect(await client.licenseState()).toBe("valid");
    expect((await client.licenseInfo()).state).toBe("valid");
  });

  test("a stored machine_info that cannot be signed over is STORAGE_CORRUPT when the server asks for it, and passing machineInfo repairs it", async () => {
    const h = await activated();
    const activation = JSON.parse((await h.storage.get(`${PREFIX}activation`)) ?? "{}");
    await h.storage.set(
      `${PREFIX}activation`,
      JSON.stringify({ ...activation, machine_info: { os: "\ud800", arch: "x64" } }),
    );
    h.server.handlers.push((req) =>
      req.path.endsWith("/heartbeat") && req.json?.machine_info === undefined
        ? FakeServer.error(422, "MACHINE_INFO_REQUIRED")
        : undefined,
    );
    const client = h.restart();
    const error = await client.heartbeat().then(
      () => undefined,
      (e: SdkError) => e,
    );
    expect(error).toMatchObject({ name: "SdkError", kind: "storage", code: "STORAGE_CORRUPT" });
    expect(error?.message).toContain("heartbeat({ machineInfo })");
    expect(await failure(client.heartbeat({ machineInfo: MACHINE }))).toBe("ok");
  });
});
