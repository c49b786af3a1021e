import { afterAll, afterEach, beforeEach, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseSealingKeyLine, sealFile } from "../../src/crypto/sealed-file.ts";
import { type LicensingClient, MemoryStorage } from "../../src/sdk/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, refusal, requestPackage, sdkClient } from "../support/offline.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * An offline package against a signed denial the device already holds: the device learns of a
 * suspension from a sealed-file key request, and a package issued before it does not lift it
 * (loading an old package again must not undo what the device was told); one issued after does.
 */
const dir = mkdtempSync(join(tmpdir(), "offline-denials-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let t: TestContext;
let fx: RuntimeFixture;
let sealingKey: string;

beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { validation_mode: "offline", max_machines: 2 },
    license: { expires_at: new Date(t.clock.now().getTime() + 90 * 86_400_000).toISOString() },
  });
  sealingKey = (await t.call("POST", `/mgmt/v1/products/${fx.productId}/sealed-files`)).body.data.current_key
    .sealing_key;
});
afterEach(() => t.close());

async function sealedFile(): Promise<Uint8Array> {
  const input = join(dir, `in-${Math.random()}`);
  writeFileSync(input, "a licensed asset");
  await sealFile(input, `${input}.sealed`, parseSealingKeyLine(sealingKey), {});
  return new Uint8Array(readFileSync(`${input}.sealed`));
}

async function packageFor(app: LicensingClient): Promise<Uint8Array> {
  const response = await requestPackage(
    t,
    fx.licenseId,
    await app.createOfflineRequest({ machineInfo: MACHINE }),
  );
  if (response.status !== 200) throw new Error(`package: ${JSON.stringify(response.error)}`);
  return response.bytes;
}

/**
 * An in-process fetch whose sealed-file key answers are held on their way until `release()`
 * (`keyAnswered` resolves once the server has answered); everything else passes straight through.
 */
function heldKeyAnswers() {
  let release: () => void = () => {};
  const held = new Promise<void>((resolve) => (release = resolve));
  let answered: () => void = () => {};
  const keyAnswered = new Promise<void>((resolve) => (answered = resolve));
  const fetch = (async (url: string, init?: RequestInit) => {
    const response = await t.app.handle(new Request(url, init));
    if (url.includes("/sealed-file-keys")) {
      answered();
      await held;
    }
    return response;
  }) as typeof globalThis.fetch;
  return { fetch, keyAnswered, release };
}

const setStatus = (status_action: string) =>
  t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, { body: { status_action } });

test("a package issued before a signed suspension the device holds does not lift it; one issued after does", async () => {
  const app = sdkClient(t, await integrationConfig(t, fx.productId));
  const old = await packageFor(app);
  await app.loadOfflinePackage(old);
  expect(await app.licenseState()).toBe("valid");

  t.clock.advance(60);
  expect((await setStatus("suspended")).status).toBe(200);
  const denied = await refusal(app.openSealedFile(await sealedFile()));
  expect(denied).toMatchObject({ code: "LICENSE_SUSPENDED", kind: "license" });
  expect(await app.licenseInfo()).toMatchObject({ state: "invalid", reason: "suspended" });

  // The old package is authentic and unexpired, but older than what the device was told.
  const reloaded = await refusal(app.loadOfflinePackage(old));
  expect(reloaded).toMatchObject({ code: "LICENSE_SUSPENDED", kind: "license", status: 403 });
  expect(reloaded.details.overtaken_server_time).toBeNumber();
  expect(await app.licenseInfo()).toMatchObject({ state: "invalid", reason: "suspended" });

  t.clock.advance(60);
  expect((await setStatus("active")).status).toBe(200);
  await app.loadOfflinePackage(await packageFor(app));
  expect(await app.licenseState()).toBe("valid");
});

test("a key request's suspension that lands after a newer package was loaded changes nothing stored", async () => {
  const { fetch, keyAnswered, release } = heldKeyAnswers();
  const app = sdkClient(t, await integrationConfig(t, fx.productId), { fetch });
  await app.loadOfflinePackage(await packageFor(app));

  t.clock.advance(60);
  await setStatus("suspended");
  const key = refusal(app.openSealedFile(await sealedFile()));
  // The server has answered (suspended, at +60 s); the answer is still on its way. The license is
  // reinstated and a package issued at +120 s is loaded meanwhile.
  await keyAnswered;
  t.clock.advance(60);
  await setStatus("active");
  await app.loadOfflinePackage(await packageFor(app));
  release();
  expect((await key).code).toBe("LICENSE_SUSPENDED");
  expect(await app.licenseState()).toBe("valid");
});

test("a key request's suspension that lands while a package is being stored waits for it and then stands", async () => {
  const { fetch, keyAnswered, release: releaseKey } = heldKeyAnswers();
  // The package's write of the certificate stops until released; a denial stored in that gap
  // would be deleted by the package's clean-up that follows it, were the two not serialised.
  let holdCertificate = false;
  let reached: () => void = () => {};
  const certificateReached = new Promise<void>((resolve) => (reached = resolve));
  let releaseWrite: () => void = () => {};
  const writeHeld = new Promise<void>((resolve) => (releaseWrite = resolve));
  class HeldStorage extends MemoryStorage {
    override async set(key: string, value: string): Promise<void> {
      if (holdCertificate && key.endsWith(".certificate")) {
        holdCertificate = false;
        reached();
        await writeHeld;
      }
      return super.set(key, value);
    }
  }
  const app = sdkClient(t, await integrationConfig(t, fx.productId), {
    fetch,
    storage: new HeldStorage(),
  });
  const issuedFirst = await packageFor(app);
  await app.loadOfflinePackage(issuedFirst);

  t.clock.advance(60);
  await setStatus("suspended");
  const key = refusal(app.openSealedFile(await sealedFile()));
  await keyAnswered;
  // The same package loaded again: no denial is stored yet, so it passes its checks and starts
  // writing; the suspension (signed 60 s after the package) lands while it writes.
  holdCertificate = true;
  const reload = app.loadOfflinePackage(issuedFirst);
  await certificateReached;
  releaseKey();
  // Time for the denial to be stored, were it not made to wait for the package's writes.
  await Promise.race([key, Bun.sleep(20)]);
  releaseWrite();
  await reload;
  expect((await key).code).toBe("LICENSE_SUSPENDED");
  expect(await app.licenseInfo()).toMatchObject({ state: "invalid", reason: "suspended" });
});
