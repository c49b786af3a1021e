import { expect, test } from "bun:test";
import { LicensingClient, MemoryStorage, type RequestInitLike, type SdkError } from "../../src/sdk/index.ts";
import type { ClientState } from "../../src/sdk/state.ts";
import { T0 } from "./support/authority.ts";
import { FakeServer } from "./support/fake-server.ts";
import { MACHINE } from "./support/setup.ts";

/**
 * Lease calls and sealed-file key requests do not wait for the client's other calls, so their
 * answers can land after the state they were made against has moved on. A late answer about an
 * activation the client no longer holds changes nothing; a heartbeat answered before the
 * activation ended does not bring it back, nor does one answered before a signed denial lift it
 * (it fails with that denial), and a denial signed before a newer answer changes nothing stored.
 */
function clientWithLateAnswers() {
  const server = new FakeServer();
  const held: { path: string; released: Promise<void> }[] = [];
  // The server decides when asked; the answer reaches the client only once released.
  const fetch = async (url: string, init: RequestInitLike) => {
    const answer = await server.fetch(url, init);
    const hold = held.find((h) => url.endsWith(h.path) || url.includes(h.path));
    if (hold) await hold.released;
    return answer;
  };
  const hold = (path: string) => {
    let release!: () => void;
    held.push({ path, released: new Promise<void>((resolve) => (release = resolve)) });
    return release;
  };
  const client = new LicensingClient({
    config: server.authority.config(),
    fetch,
    storage: new MemoryStorage(),
    now: () => T0 * 1000,
  });
  return { server, client, hold };
}

const settled = (promise: Promise<unknown>) =>
  promise.then(
    () => "ok",
    (error: SdkError) => error.code,
  );

test("a lease call's late signed 410 for an activation the client has since replaced leaves the new one alone", async () => {
  const { server, client, hold } = clientWithLateAnswers();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  const release = hold("/runtime/v1/leases");
  server.handlers.push((req) =>
    req.path === "/runtime/v1/leases" ? server.denial(req, 410, "ACTIVATION_DEACTIVATED") : undefined,
  );
  const lease = settled(client.acquireLease("i1"));
  await client.deactivate();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  const replaced = await client.activationId();
  release();
  await lease;
  expect(await client.activationId()).toBe(replaced);
  expect(await client.licenseInfo()).toMatchObject({ state: "valid", reason: "ok" });
});

test("a heartbeat answered before a lease call's signed 410 does not bring the ended activation back", async () => {
  const { server, client, hold } = clientWithLateAnswers();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  const release = hold("/heartbeat");
  server.handlers.push((req) =>
    req.path === "/runtime/v1/leases" ? server.denial(req, 410, "ACTIVATION_DEACTIVATED") : undefined,
  );
  const heartbeat = settled(client.heartbeat());
  expect(await settled(client.acquireLease("i1"))).toBe("ACTIVATION_DEACTIVATED");
  expect(await client.activationId()).toBeUndefined();
  release();
  expect(await heartbeat).toBe("NOT_ACTIVATED");
  expect(await client.activationId()).toBeUndefined();
  expect((await client.licenseInfo()).state).toBe("invalid");
});

test("a heartbeat answered before a lease call's signed LICENSE_REVOKED does not lift that newer denial; one answered after it does", async () => {
  const { server, client, hold } = clientWithLateAnswers();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  const own = await client.activationId();
  // The server answers the heartbeat at T0 (held back on its way), then revokes and signs the
  // lease call's denial a minute later.
  server.sign = (req) => ({ serverTime: req.path === "/runtime/v1/leases" ? T0 + 60 : T0 });
  server.handlers.push((req) =>
    req.path === "/runtime/v1/leases" ? server.denial(req, 403, "LICENSE_REVOKED") : undefined,
  );
  const release = hold("/heartbeat");
  const heartbeat = settled(client.heartbeat());
  expect(await settled(client.acquireLease("i1"))).toBe("LICENSE_REVOKED");
  expect(await client.licenseInfo()).toMatchObject({ state: "invalid", reason: "revoked" });
  const certificate = (await client.licenseInfo()).claims;
  release();
  // The older answer is authentic, but the denial signed after it is the newer word: the
  // heartbeat fails with it and keeps nothing (its certificate would be a minute fresher).
  expect(await heartbeat).toBe("LICENSE_REVOKED");
  expect((await client.licenseInfo()).claims).toEqual(certificate);
  expect(await client.activationId()).toBe(own);
  expect(await client.licenseInfo()).toMatchObject({ state: "invalid", reason: "revoked" });
  expect(await client.licenseState()).toBe("invalid");

  // A heartbeat the server answers after the denial is the newer word (the license is usable
  // again) and lifts it.
  server.sign = () => ({ serverTime: T0 + 120 });
  expect((await client.heartbeat()).serverTime).toBe(T0 + 120);
  expect(await client.licenseInfo()).toMatchObject({ state: "valid", reason: "ok" });
});

test("a lease call's signed denial that lands after a newer heartbeat answer changes nothing stored", async () => {
  const { server, client, hold } = clientWithLateAnswers();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  // The server suspends and signs the lease call's denial at T0 + 60 (held back on its way), then
  // reinstates the license and answers a heartbeat at T0 + 120.
  server.sign = (req) => ({ serverTime: req.path === "/runtime/v1/leases" ? T0 + 60 : T0 + 120 });
  server.handlers.push((req) =>
    req.path === "/runtime/v1/leases" ? server.denial(req, 403, "LICENSE_SUSPENDED") : undefined,
  );
  const release = hold("/runtime/v1/leases");
  const lease = settled(client.acquireLease("i1"));
  expect((await client.heartbeat()).serverTime).toBe(T0 + 120);
  release();
  // The call itself failed with the server's word, but the license stays as the newer answer left it.
  expect(await lease).toBe("LICENSE_SUSPENDED");
  expect(await client.licenseInfo()).toMatchObject({ state: "valid", reason: "ok" });

  // A denial signed in the same second as the heartbeat answer stands (which came first cannot be told).
  server.sign = () => ({ serverTime: T0 + 120 });
  expect(await settled(client.acquireLease("i2"))).toBe("LICENSE_SUSPENDED");
  expect(await client.licenseInfo()).toMatchObject({ state: "invalid", reason: "suspended" });
});

test("a late denial signed before the stored one does not replace it", async () => {
  const { server, client, hold } = clientWithLateAnswers();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  // A suspension signed at T0 + 60 is held back; a revocation signed at T0 + 90 lands first.
  server.sign = (req) => ({ serverTime: req.path === "/runtime/v1/leases" ? T0 + 60 : T0 + 90 });
  server.handlers.push((req) =>
    req.path === "/runtime/v1/leases"
      ? server.denial(req, 403, "LICENSE_SUSPENDED")
      : req.path.endsWith("/heartbeat")
        ? server.denial(req, 403, "LICENSE_REVOKED")
        : undefined,
  );
  const release = hold("/runtime/v1/leases");
  const lease = settled(client.acquireLease("i1"));
  expect(await settled(client.heartbeat())).toBe("LICENSE_REVOKED");
  release();
  expect(await lease).toBe("LICENSE_SUSPENDED");
  expect(await client.licenseInfo()).toMatchObject({ state: "invalid", reason: "revoked" });
});

test("a lease answer held back on its way while heartbeats answered does not wind the verified time back", async () => {
  const { server, client, hold } = clientWithLateAnswers();
  const memory = (client as unknown as { state: ClientState }).state;
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  server.sign = (req) => ({ serverTime: req.path === "/runtime/v1/leases" ? T0 : T0 + 600 });
  const release = hold("/runtime/v1/leases");
  const lease = settled(client.acquireLease("i1"));
  // The lease's answer (signed at T0) is held; a heartbeat answered at T0 + 600 lands first.
  await client.heartbeat();
  expect(await memory.timeHighWater()).toBe(T0 + 600);
  release();
  expect(await lease).toBe("ok");
  expect(await memory.timeHighWater()).toBe(T0 + 600);
  expect(await memory.localHighWater()).toBe(T0 + 600);
});

/** A client whose storage stops on the next write of `suffix` until `release()`. */
function clientWithHeldWrite() {
  const server = new FakeServer();
  const memory = new MemoryStorage();
  const hold: { suffix?: string; reached?: Promise<void>; release: () => void } = { release: () => {} };
  let reached: () => void = () => {};
  const storage = {
    get: (key: string) => memory.get(key),
    delete: (key: string) => memory.delete(key),
    async set(key: string, value: string) {
      if (hold.suffix !== undefined && key.endsWith(hold.suffix)) {
        hold.suffix = undefined;
        reached();
        await new Promise<void>((resolve) => (hold.release = resolve));
      }
      await memory.set(key, value);
    },
  };
  const holdNext = (suffix: string) => {
    hold.suffix = suffix;
    hold.reached = new Promise<void>((resolve) => (reached = resolve));
    return hold;
  };
  const client = new LicensingClient({
    config: server.authority.config(),
    fetch: (url, init) => server.fetch(url, init),
    storage,
    now: () => T0 * 1000,
  });
  // Resolves once `count` changes of the activation's records have been asked for in all: a call
  // that has reached the lock (and waits there behind the held one).
  const records = (client as unknown as { state: ClientState }).state;
  const lock = records.activationRecords.bind(records);
  let asked = 0;
  const waiters: { count: number; resolve: () => void }[] = [];
  records.activationRecords = <T>(change: () => Promise<T>) => {
    asked++;
    for (const waiter of waiters) if (asked >= waiter.count) waiter.resolve();
    return lock(change);
  };
  const recordsAsked = (count: number) =>
    new Promise<void>((resolve) => {
      if (asked >= count) resolve();
      else waiters.push({ count, resolve });
    });
  return { server, client, memory, holdNext, recordsAsked };
}

test("a signed denial that arrives while a heartbeat answer is being stored waits for it and then stands", async () => {
  const { server, client, holdNext, recordsAsked } = clientWithHeldWrite();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  server.sign = (req) => ({ serverTime: req.path === "/runtime/v1/leases" ? T0 + 60 : T0 });
  server.handlers.push((req) =>
    req.path === "/runtime/v1/leases" ? server.denial(req, 403, "LICENSE_REVOKED") : undefined,
  );
  const hold = holdNext(".certificate");
  const heartbeat = settled(client.heartbeat());
  await hold.reached;
  // The revocation (signed a minute after the heartbeat's answer) lands while that answer is
  // being stored; had it been stored then, the heartbeat's clean-up would have deleted it.
  const lease = settled(client.acquireLease("i1"));
  // The activation's own write, the heartbeat's (held), then the lease's; and time for the lease
  // to finish, were it not made to wait for the heartbeat.
  await recordsAsked(3);
  await Promise.race([lease, Bun.sleep(20)]);
  hold.release();
  expect(await heartbeat).toBe("ok");
  expect(await lease).toBe("LICENSE_REVOKED");
  expect(await client.licenseInfo()).toMatchObject({ state: "invalid", reason: "revoked" });
});

test("a signed 410 that arrives while a heartbeat answer is being stored ends the activation after it", async () => {
  const { server, client, memory, holdNext, recordsAsked } = clientWithHeldWrite();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  server.handlers.push((req) =>
    req.path === "/runtime/v1/leases" ? server.denial(req, 410, "ACTIVATION_DEACTIVATED") : undefined,
  );
  const hold = holdNext(".certificate");
  // With new machine info the heartbeat also writes the activation record back.
  const heartbeat = settled(client.heartbeat({ machineInfo: { ...MACHINE, hostname: "build-8" } }));
  await hold.reached;
  const lease = settled(client.acquireLease("i1"));
  // The activation's own write, the heartbeat's (held), then the lease's; and time for the lease
  // to finish, were it not made to wait for the heartbeat.
  await recordsAsked(3);
  await Promise.race([lease, Bun.sleep(20)]);
  hold.release();
  expect(await heartbeat).toBe("ok");
  expect(await lease).toBe("ACTIVATION_DEACTIVATED");
  expect(await client.activationId()).toBeUndefined();
  // Nothing of the activation is left behind to be taken for a live one.
  expect(memory.keys().filter((key) => /\.(activation|certificate|last_heartbeat)$/.test(key))).toEqual([]);
  expect((await client.licenseInfo()).state).toBe("invalid");
});

test("a heartbeat's own signed denial is kept even when the server's clock put it before the last answer", async () => {
  const { server, client } = clientWithLateAnswers();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  // The server's clock stepped back between two heartbeats: the later one, a revocation, carries
  // an earlier second. Heartbeats run one at a time, so it is the newer word all the same.
  server.sign = () => ({ serverTime: T0 + 12 });
  await client.heartbeat();
  server.sign = () => ({ serverTime: T0 + 10 });
  server.handlers.push((req) =>
    req.path.endsWith("/heartbeat") ? server.denial(req, 403, "LICENSE_REVOKED") : undefined,
  );
  expect(await settled(client.heartbeat())).toBe("LICENSE_REVOKED");
  expect(await client.licenseInfo()).toMatchObject({ state: "invalid", reason: "revoked" });
});

test("a heartbeat's own denial replaces the stored one even when the server's clock put it earlier", async () => {
  const { server, client } = clientWithLateAnswers();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  let next = { code: "LICENSE_SUSPENDED", at: T0 + 12 };
  server.sign = () => ({ serverTime: next.at });
  server.handlers.push((req) =>
    req.path.endsWith("/heartbeat") ? server.denial(req, 403, next.code) : undefined,
  );
  expect(await settled(client.heartbeat())).toBe("LICENSE_SUSPENDED");
  // The server's clock stepped back before the next heartbeat, which hears the revocation.
  next = { code: "LICENSE_REVOKED", at: T0 + 10 };
  expect(await settled(client.heartbeat())).toBe("LICENSE_REVOKED");
  expect(await client.licenseInfo()).toMatchObject({ state: "invalid", reason: "revoked" });
});

test("a signed 410 for the old activation being recorded while the client deactivates and activates again ends only the old one", async () => {
  const { server, client, holdNext } = clientWithHeldWrite();
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });
  const old = await client.activationId();
  server.handlers.push((req) =>
    req.path === "/runtime/v1/leases" ? server.denial(req, 410, "ACTIVATION_DEACTIVATED") : undefined,
  );
  const hold = holdNext(".denial");
  const lease = settled(client.acquireLease("i1"));
  await hold.reached;
  // While the 410 is being recorded, the app deactivates and activates again; were those writes
  // not made to wait, recording the 410 would then end the new activation.
  const again = client.deactivate().then(() => client.activate({ licenseKey: "LK", machineInfo: MACHINE }));
  await Promise.race([again, Bun.sleep(30)]);
  hold.release();
  expect(await lease).toBe("ACTIVATION_DEACTIVATED");
  await again;
  const current = await client.activationId();
  expect(current).toBeDefined();
  expect(current).not.toBe(old);
  expect(await client.licenseInfo()).toMatchObject({ state: "valid", reason: "ok" });
});

test("an answer that took longer than 30 s to come back does not reset the local time mark; one back within 30 s does", async () => {
  const server = new FakeServer();
  let heldUntil: Promise<void> | undefined;
  let answered = () => {};
  const fetch = async (url: string, init: RequestInitLike) => {
    const answer = await server.fetch(url, init);
    if (url.endsWith("/heartbeat")) answered();
    if (heldUntil && url.endsWith("/heartbeat")) await heldUntil;
    return answer;
  };
  const heartbeatAnswered = () => new Promise<void>((resolve) => (answered = resolve));
  let nowMs = T0 * 1000;
  let monotonicMs = 0;
  const client = new LicensingClient({
    config: server.authority.config(),
    fetch,
    storage: new MemoryStorage(),
    now: () => nowMs,
    monotonicNow: () => monotonicMs,
  });
  const memory = (client as unknown as { state: ClientState }).state;
  await client.activate({ licenseKey: "LK", machineInfo: MACHINE });

  // The heartbeat is answered at T0 + 60, then held back for three hours, while the app keeps
  // reading its license (each read raises the local mark); then the clock is put back to T0 + 60
  // and the answer let through.
  server.sign = () => ({ serverTime: T0 + 60 });
  let release!: () => void;
  heldUntil = new Promise<void>((resolve) => (release = resolve));
  nowMs = (T0 + 60) * 1000;
  const onItsWay = heartbeatAnswered();
  const heartbeat = settled(client.heartbeat());
  await onItsWay;
  monotonicMs += 3 * 3_600_000;
  nowMs = (T0 + 60 + 3 * 3600) * 1000;
  expect((await client.licenseInfo()).state).toBe("valid");
  expect(await memory.localHighWater()).toBe(T0 + 60 + 3 * 3600);
  nowMs = (T0 + 60) * 1000;
  release();
  expect(await heartbeat).toBe("ok");
  // Three hours on its way: the mark stands, and the clock put back is caught.
  expect(await memory.localHighWater()).toBe(T0 + 60 + 3 * 3600);
  expect(await client.licenseInfo()).toMatchObject({ state: "clock_tampered" });

  // The same answer back within 30 s is the server's time now: the mark restarts at it.
  heldUntil = undefined;
  server.sign = () => ({ serverTime: T0 + 120 });
  nowMs = (T0 + 120) * 1000;
  const back = heartbeatAnswered();
  const quick = client.heartbeat();
  await back;
  monotonicMs += 29_000;
  await quick;
  expect(await memory.localHighWater()).toBe(T0 + 120);
  expect((await client.licenseInfo()).state).toBe("valid");
});
