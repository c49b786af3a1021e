import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { createApp } from "../../src/app.ts";
import { keyIdOf } from "../../src/crypto/keys.ts";
import { Keystore } from "../../src/crypto/keystore.ts";
import { parseSealingKeyLine } from "../../src/crypto/sealed-file.ts";
import { silentLogger } from "../../src/http/logger.ts";
import { sweepOnce } from "../../src/jobs/sweeper.ts";
import { SealingKeyError, SealingKeyLifecycle } from "../../src/modules/sealed-files/lifecycle.ts";
import { createServices } from "../../src/services.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { holdKeystoreLock } from "../support/keystore-lock.ts";

/** GET/POST /mgmt/v1/products/{id}/sealed-files: status, one-way enabling, and its refusals. */
let t: TestContext;
let productId: string;

async function product(environment: "live" | "test" = "live") {
  const key = environment === "live" ? t.keys.live : t.keys.test;
  const response = await t.call("POST", "/mgmt/v1/products", {
    key,
    body: { name: "Desk", code: `desk-${Math.random().toString(36).slice(2, 10)}`, environment },
    headers: t.idem(),
  });
  return response.body.data.public_id as string;
}

beforeEach(async () => {
  t = createTestContext();
  productId = await product();
});
afterEach(() => t.close());

const path = (id = productId) => `/mgmt/v1/products/${id}/sealed-files`;
const enabledEvents = () =>
  t.deps.sqlite
    .query<{ n: number }, []>(
      "SELECT count(*) AS n FROM audit_events WHERE type = 'product.sealed_files_enabled'",
    )
    .get()?.n;

describe("status and enabling", () => {
  test("a new product has sealed files disabled and no key", async () => {
    const response = await t.call("GET", path());
    expect(response.status).toBe(200);
    expect(response.body.data).toEqual({
      product_id: productId,
      status: "disabled",
      current_key: null,
      keys: [],
    });
  });

  test("enabling creates a P-256 key whose one-line sealing key the sealing tool accepts", async () => {
    const response = await t.call("POST", path());
    expect(response.status).toBe(200);
    const { status, current_key: key } = response.body.data;
    expect(status).toBe("enabled");
    expect(key.public_key).toMatch(/^p256:[A-Za-z0-9_-]{87}$/);
    expect(key.key_id).toBe(keyIdOf(key.public_key));
    expect(key.sealing_key).toBe(
      `service-sealing-key-v1:${productId}:${key.key_id}:${key.public_key.slice("p256:".length)}`,
    );
    expect(key.sealing_key).not.toContain("\n");
    expect(parseSealingKeyLine(key.sealing_key).productId).toBe(productId);
    expect(t.deps.keystore.has(`product-sealing:${key.key_id}`)).toBe(true);
    // The one key is also listed, as the current, active one.
    expect(response.body.data.keys).toEqual([{ ...key, status: "active", current: true, retired_at: null }]);
    expect((await t.call("GET", path())).body.data).toEqual(response.body.data);
  });

  test("enabling again changes nothing: same key, and only the first enabling is audited", async () => {
    const first = await t.call("POST", path());
    const second = await t.call("POST", path());
    expect(second.status).toBe(200);
    expect(second.body.data).toEqual(first.body.data);
    expect(enabledEvents()).toBe(1);
    const event = (await t.call("GET", "/mgmt/v1/events")).body.data.find(
      (e: { type: string }) => e.type === "product.sealed_files_enabled",
    );
    expect(event).toMatchObject({
      target: { type: "product", id: productId, environment: "live" },
      data: { key_id: first.body.data.current_key.key_id },
    });
  });

  test("there is no way to turn sealed files off", async () => {
    await t.call("POST", path());
    expect((await t.call("DELETE", path())).status).toBe(404);
    expect((await t.call("PATCH", path(), { body: { status: "disabled" } })).status).toBe(404);
    expect((await t.call("GET", path())).body.data.status).toBe("enabled");
  });

  test("an archived product answers 409 PRODUCT_ARCHIVED to both, and another environment's 404", async () => {
    const testProduct = await product("test");
    expect((await t.call("GET", path(testProduct))).status).toBe(404);
    expect((await t.call("POST", path(testProduct))).status).toBe(404);
    await t.call("DELETE", `/mgmt/v1/products/${productId}`);
    for (const method of ["GET", "POST"]) {
      const response = await t.call(method, path());
      expect([response.status, response.body.error.code]).toEqual([409, "PRODUCT_ARCHIVED"]);
    }
  });
});

describe("what stops enabling", () => {
  test("a plan without sealed files answers 403 PLAN_ENTITLEMENT_REQUIRED; the status says not_entitled and keeps the key", async () => {
    await t.call("POST", path());
    const other = await product();
    t.workspace.setPlan("personal", { type: "system" });
    const response = await t.call("POST", path(other));
    expect([response.status, response.body.error.code]).toEqual([403, "PLAN_ENTITLEMENT_REQUIRED"]);
    expect(response.body.error.details).toEqual({ entitlement: "sealed_files" });
    expect((await t.call("GET", path(other))).body.data).toMatchObject({
      status: "not_entitled",
      current_key: null,
    });
    const kept = (await t.call("GET", path())).body.data;
    expect(kept.status).toBe("not_entitled");
    expect(kept.current_key.key_id).toMatch(/^k_/);
  });

  test("an environment that does not offer sealed files answers 409 SEALED_FILES_UNAVAILABLE; its status is unavailable", async () => {
    const liveOnly = createApp(t.deps, { baseUrl: BASE_URL, sealedFileEnvironments: ["live"] });
    const call = async (method: string, id: string, key: string) => {
      const response = await liveOnly.handle(
        new Request(`${BASE_URL}${path(id)}`, { method, headers: { authorization: `Bearer ${key}` } }),
      );
      return { status: response.status, body: await response.json() };
    };
    const testProduct = await product("test");
    const refused = await call("POST", testProduct, t.keys.test);
    expect([refused.status, refused.body.error.code]).toEqual([409, "SEALED_FILES_UNAVAILABLE"]);
    expect(refused.body.error.details).toEqual({ environment: "test" });
    expect((await call("GET", testProduct, t.keys.test)).body.data.status).toBe("unavailable");
    expect((await call("POST", productId, t.keys.live)).body.data.status).toBe("enabled");
  });

  test("a keystore held by another process answers 503 SEALED_FILES_KEY_UNAVAILABLE, retryable, and creates nothing", async () => {
    const release = holdKeystoreLock(t.deps.keystore.path);
    try {
      const response = await t.call("POST", path());
      expect([response.status, response.body.error.code, response.body.error.retryable]).toEqual([
        503,
        "SEALED_FILES_KEY_UNAVAILABLE",
        true,
      ]);
    } finally {
      release();
    }
    expect((await t.call("GET", path())).body.data.status).toBe("disabled");
    expect(enabledEvents()).toBe(0);
    expect((await t.call("POST", path())).body.data.status).toBe("enabled");
  }, 20_000);
});

describe("compromised keys", () => {
  test("the sweep removes a compromised key's private half that an interrupted command left in the keystore, and only that", async () => {
    const enabled = (await t.call("POST", path())).body.data.current_key.key_id as string;
    const other = await product();
    const kept = (await t.call("POST", path(other))).body.data.current_key.key_id as string;
    // What a command killed between its committed compromise and the keystore removal leaves.
    t.deps.sqlite.run("UPDATE sealing_keys SET status = 'compromised', is_current = 0 WHERE key_id = ?", [
      enabled,
    ]);
    expect(t.deps.keystore.has(`product-sealing:${enabled}`)).toBe(true);
    const done = sweepOnce(createServices(t.deps, { baseUrl: BASE_URL }), silentLogger);
    expect(done.compromised_sealing_keys).toBe(1);
    expect(t.deps.keystore.has(`product-sealing:${enabled}`)).toBe(false);
    expect(Keystore.open(t.deps.keystore.path, "test passphrase").has(`product-sealing:${enabled}`)).toBe(
      false,
    );
    expect(t.deps.keystore.has(`product-sealing:${kept}`)).toBe(true);
    expect(
      sweepOnce(createServices(t.deps, { baseUrl: BASE_URL }), silentLogger).compromised_sealing_keys,
    ).toBe(0);
  });

  test("a compromise the command line finished leaves the server's memory at the next sweep, though no device asks for the key again", async () => {
    const enabled = (await t.call("POST", path())).body.data.current_key.key_id as string;
    const services = createServices(t.deps, { baseUrl: BASE_URL });
    // A key release derived and kept the key's private scalar.
    const scalar = services.sealedFiles.privateScalar(enabled);
    expect(scalar.some((byte) => byte !== 0)).toBe(true);
    const held = t.deps.keystore.secret(`product-sealing:${enabled}`);
    // The command line, in its own process, compromises the key and removes it from the file.
    const cli = new SealingKeyLifecycle({
      ...t.deps,
      keystore: Keystore.open(t.deps.keystore.path, "test passphrase"),
    });
    const actor = { type: "cli" as const, id: "ops" };
    cli.rotate(productId, actor);
    cli.retire(productId, enabled, { compromised: true, actor });
    expect(t.deps.keystore.has(`product-sealing:${enabled}`)).toBe(true);

    sweepOnce(services, silentLogger);
    expect(t.deps.keystore.has(`product-sealing:${enabled}`)).toBe(false);
    expect(scalar.every((byte) => byte === 0)).toBe(true);
    expect(held.every((byte) => byte === 0)).toBe(true);
  });

  test("once a compromise is finished, later sweeps read no keystore file for it", async () => {
    const enabled = (await t.call("POST", path())).body.data.current_key.key_id as string;
    t.deps.sqlite.run("UPDATE sealing_keys SET status = 'compromised', is_current = 0 WHERE key_id = ?", [
      enabled,
    ]);
    // One service set, as a running server has.
    const services = createServices(t.deps, { baseUrl: BASE_URL });
    expect(sweepOnce(services, silentLogger).compromised_sealing_keys).toBe(1);
    // The file is now unreadable: a sweep that re-read it would fail its step.
    const original = readFileSync(t.deps.keystore.path);
    writeFileSync(t.deps.keystore.path, "not a keystore");
    try {
      const failures: string[] = [];
      const logger = { log: (level: string, msg: string) => void (level === "error" && failures.push(msg)) };
      expect(sweepOnce(services, logger).compromised_sealing_keys).toBe(0);
      expect(failures).toEqual([]);
    } finally {
      writeFileSync(t.deps.keystore.path, original);
    }
  });

  test("the sweep also removes the private half of a key another process added after this one read the keystore", async () => {
    await t.call("POST", path());
    // The command line, in its own process with its own copy of the keystore, rotates twice.
    const cli = new SealingKeyLifecycle({
      ...t.deps,
      keystore: Keystore.open(t.deps.keystore.path, "test passphrase"),
    });
    const actor = { type: "cli" as const, id: "ops" };
    const added = cli.rotate(productId, actor).key_id;
    cli.rotate(productId, actor);
    expect(t.deps.keystore.has(`product-sealing:${added}`)).toBe(false);
    // Its compromise of the first is killed between the committed status and the keystore removal.
    t.deps.sqlite.run("UPDATE sealing_keys SET status = 'compromised' WHERE key_id = ?", [added]);
    const done = sweepOnce(createServices(t.deps, { baseUrl: BASE_URL }), silentLogger);
    expect(done.compromised_sealing_keys).toBe(1);
    expect(Keystore.open(t.deps.keystore.path, "test passphrase").has(`product-sealing:${added}`)).toBe(
      false,
    );
  });

  test("a compromise commits with synced writes before the private half goes, and the store's setting comes back", async () => {
    const first = (await t.call("POST", path())).body.data.current_key.key_id as string;
    const lifecycle = new SealingKeyLifecycle(t.deps);
    const actor = { type: "cli" as const, id: "ops" };
    lifecycle.rotate(productId, actor);
    const synchronous = () =>
      t.deps.sqlite.query<{ synchronous: number }, []>("PRAGMA synchronous").get()?.synchronous;
    const seen: (number | undefined)[] = [];
    const remove = t.deps.keystore.remove.bind(t.deps.keystore);
    t.deps.keystore.remove = (ids) => {
      seen.push(synchronous());
      return remove(ids);
    };
    lifecycle.retire(productId, first, { compromised: true, actor });
    // 2 = FULL: the compromise's commit reached the disk before the removal ran; 1 = NORMAL again.
    expect(seen).toEqual([2]);
    expect(synchronous()).toBe(1);
    expect(t.deps.keystore.has(`product-sealing:${first}`)).toBe(false);
  });

  test("a compromised key is never downgraded to retired, and the refusal changes nothing", async () => {
    const first = (await t.call("POST", path())).body.data.current_key.key_id as string;
    const lifecycle = new SealingKeyLifecycle(t.deps);
    const actor = { type: "cli" as const, id: "ops" };
    lifecycle.rotate(productId, actor);
    lifecycle.retire(productId, first, { compromised: true, actor });
    const rows = () =>
      t.deps.sqlite.query("SELECT key_id, status, retired_at FROM sealing_keys ORDER BY rowid").all();
    const audits = () => t.deps.sqlite.query("SELECT id FROM audit_events").all().length;
    const [before, auditsBefore] = [rows(), audits()];
    expect(() => lifecycle.retire(productId, first, { compromised: false, actor })).toThrow(SealingKeyError);
    expect(rows()).toEqual(before);
    expect(audits()).toBe(auditsBefore);
  });
});
