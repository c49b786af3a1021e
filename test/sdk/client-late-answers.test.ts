import { expect, test } from "bun:test";
import { LicensingClient, MemoryStorage, type RequestInitLike, type SdkError } from "../../src/sdk/index.ts";
import { T0 } from "./support/authority.ts";
import { FakeServer } from "./support/fake-server.ts";
import { MACHINE } from "./support/setup.ts";

/**
 * Lease calls and sealed-file key requests do not wait for the client's other calls, so their
 * answers can land after the state they were made against has moved on. A late answer about an
 * activation the client no longer holds changes nothing; a heartbeat answered before the
 * activation ended does not bring it back.
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
