import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { Keystore } from "../../src/crypto/keystore.ts";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import { TrustService } from "../../src/modules/trust/service.ts";
import { freshNonce, TestDevice } from "../support/device.ts";
import { expectSignedEnvelope, expectValidBundle, verifiedCertificate } from "../support/envelope.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { activate, nowSec, type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, { policy: { max_machines: 10 } });
});
afterEach(() => t.close());

const bundleOf = async (productId: string) =>
  (await t.call("GET", `/runtime/v1/products/${productId}/trust-bundle`, { key: null })).body.data;

/** The command line's view of the same data dir: its own keystore copy and trust service. */
function commandLineTrust(): TrustService {
  const keystore = Keystore.open(join(t.dir, "keystore.json"), "test passphrase");
  return new TrustService({ ...t.deps, keystore, secrets: new SecretBox(keystore.secret("data-key")) });
}

describe("trust bundle", () => {
  test("the bundle verifies with the root key of the integration config, and lists the active key", async () => {
    const data = await bundleOf(fx.productId);
    expectValidBundle(data, fx.rootPublicKey);
    expect(data.bundle).toMatchObject({ v: 1, product_id: fx.productId, environment: "live", sequence: 1 });
    expect(data.bundle.signing_keys).toEqual([
      expect.objectContaining({ status: "active", not_after: null }),
    ]);
  });

  test("a bundle signed by another root, or changed after signing, does not verify", async () => {
    const data = await bundleOf(fx.productId);
    const testRoot = (await runtimeFixture(t, { key: t.keys.test })).rootPublicKey;
    expect(testRoot).not.toBe(fx.rootPublicKey);
    expect(() => expectValidBundle(data, testRoot)).toThrow();
    expect(() =>
      expectValidBundle({ ...data, bundle: { ...data.bundle, sequence: 99 } }, fx.rootPublicKey),
    ).toThrow();
  });

  test("an unknown product answers 404", async () => {
    const response = await t.call(
      "GET",
      "/runtime/v1/products/prod_01M81Z00000000000000000000/trust-bundle",
      { key: null },
    );
    expect(response.status).toBe(404);
  });

  test("the test environment has its own root, given as development_root_public_key", async () => {
    const testFx = await runtimeFixture(t, { key: t.keys.test });
    const config = (
      await t.call("GET", `/mgmt/v1/products/${testFx.productId}/integration-config`, { key: t.keys.test })
    ).body.data.config;
    expect(config.trust_anchor.root_public_key).toBeNull();
    expect(config.environment).toBe("test");
    expectValidBundle(await bundleOf(testFx.productId), config.trust_anchor.development_root_public_key);
  });
});

describe("key rotation", () => {
  test("rotating from the command line bumps the sequence, keeps the old key as retired, and the server signs with the new key", async () => {
    const before = await bundleOf(fx.productId);
    const oldKey = before.bundle.signing_keys[0].key_id;
    // not_after is the rotation's second plus the overlap: no second may pass before it is compared.
    t.clock.freeze();
    const newKey = commandLineTrust().rotate(fx.productId, { retainSec: 86_400 }).key_id;
    const after = await bundleOf(fx.productId);
    expectValidBundle(after, fx.rootPublicKey);
    expect(after.bundle.sequence).toBe(before.bundle.sequence + 1);
    expect(after.bundle.signing_keys).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ key_id: oldKey, status: "retired", not_after: nowSec(t) + 86_400 }),
        expect.objectContaining({ key_id: newKey, status: "active" }),
      ]),
    );
    const product = await t.call("GET", `/mgmt/v1/products/${fx.productId}`);
    expect(product.body.data.trust_bundle_sequence).toBe(after.bundle.sequence);
    const activated = await activate(t, new TestDevice(), fx);
    expect(activated.status).toBe(201);
    expect(verifiedCertificate(activated.body.data.certificate, after.bundle).header.kid).toBe(newKey);
    expect(activated.body.signing_delegation.delegation.parent_key_id).toBe(newKey);
  });

  test("by default a retired key stays listed as long as a certificate of the product's policies stays usable: cert_ttl_sec, plus network_grace_sec where the policy fails open", async () => {
    const open = await runtimeFixture(t, {
      policy: {
        cert_ttl_sec: 86_400,
        heartbeat_sec: 43_200,
        fail_mode: "open",
        network_grace_sec: 3 * 86_400,
      },
    });
    // A longer certificate, but failing closed: its grace never applies (the certificate says 0).
    const closed = await t.call("POST", "/mgmt/v1/policies", {
      body: {
        product_id: open.productId,
        name: "Closed",
        cert_ttl_sec: 2 * 86_400,
        heartbeat_sec: 43_200,
        fail_mode: "closed",
        network_grace_sec: 10 * 86_400,
      },
      headers: t.idem(),
    });
    expect(closed.status).toBe(201);
    const oldKey = open.bundle.signing_keys[0]?.key_id;
    t.clock.freeze();
    const rotation = commandLineTrust().rotate(open.productId);
    expect(rotation.retired?.key_id).toBe(oldKey);
    expect(rotation.retired?.not_after).toBe(nowSec(t) + 4 * 86_400);
    expect(rotation.retired?.certificates_usable_until).toBe(nowSec(t) + 4 * 86_400);
    const listed = (await bundleOf(open.productId)).bundle.signing_keys.find(
      (k: { key_id: string }) => k.key_id === oldKey,
    );
    expect(listed).toMatchObject({ status: "retired", not_after: nowSec(t) + 4 * 86_400 });
  });

  test("a retired key leaves the bundle once its retention has passed", async () => {
    const trust = commandLineTrust();
    trust.rotate(fx.productId, { retainSec: 3600 });
    t.clock.advance(3601);
    expect(trust.pruneExpiredKeys()).toBe(1);
    const bundle = (await bundleOf(fx.productId)).bundle;
    expect(bundle.signing_keys).toHaveLength(1);
    expect(bundle.sequence).toBe(3);
  });

  test("a bundle left behind its keys (a rotation whose rebuild never committed) is rebuilt by the sweeper, so it lists the active key", async () => {
    const before = await bundleOf(fx.productId);
    const trust = commandLineTrust();
    const newKey = trust.rotate(fx.productId).key_id;
    // What an older version left when the server committed during its rebuild: the keys
    // changed, the stored bundle did not.
    t.deps.sqlite
      .query("UPDATE trust_bundles SET sequence = ?, bundle = ?, root_signature = ? WHERE product_id = ?")
      .run(before.bundle.sequence, canonicalize(before.bundle), before.root_signature, fx.productId);
    expect(trust.pruneExpiredKeys()).toBe(1);
    const repaired = await bundleOf(fx.productId);
    expectValidBundle(repaired, fx.rootPublicKey);
    expect(repaired.bundle.sequence).toBeGreaterThan(before.bundle.sequence);
    expect(repaired.bundle.signing_keys.find((k: { status: string }) => k.status === "active").key_id).toBe(
      newKey,
    );
    // A bundle that says what the keys say is left alone.
    expect(trust.pruneExpiredKeys()).toBe(0);
  });

  test("a compromised key stays listed as compromised so devices refuse what it signed", async () => {
    const trust = commandLineTrust();
    const old = (await bundleOf(fx.productId)).bundle.signing_keys[0].key_id;
    trust.rotate(fx.productId, { retainSec: 86_400 });
    trust.retire(old, { compromised: true });
    const listed = (await bundleOf(fx.productId)).bundle.signing_keys.find(
      (k: { key_id: string }) => k.key_id === old,
    );
    expect(listed.status).toBe("compromised");
  });
});

describe("online keys", () => {
  test("responses are signed by a daily online key vouched for by a delegation of at most 7 days", async () => {
    const time = async () => {
      const nonce = freshNonce();
      const response = await t.call("POST", "/runtime/v1/time", {
        key: null,
        body: { product_id: fx.productId, nonce },
      });
      expectSignedEnvelope(response.body, { status: 200, nonce, productId: fx.productId, bundle: fx.bundle });
      return response.body;
    };
    const today = await time();
    expect(today.data).toBe(
      new Date(today.response_assertion.server_time * 1000).toISOString().replace(".000Z", "Z"),
    );
    t.clock.advance(86_400);
    const tomorrow = await time();
    expect(tomorrow.response_assertion.key_id).not.toBe(today.response_assertion.key_id);
  });

  test("the time endpoint refuses an unknown product and a short nonce", async () => {
    const unknown = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: "prod_01M81Z00000000000000000000", nonce: freshNonce() },
    });
    expect(unknown.status).toBe(404);
    const short = await t.call("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: fx.productId, nonce: "short" },
    });
    expect(short.status).toBe(422);
  });
});

describe("integration config", () => {
  test("service.config.json matches the trust bundle and names the entitlements of active policies", async () => {
    await t.call("POST", "/mgmt/v1/policies", {
      body: { product_id: fx.productId, name: "Pro", entitlements: { export: true, seats: 5 } },
      headers: t.idem(),
    });
    const response = await t.call("GET", `/mgmt/v1/products/${fx.productId}/integration-config`);
    expect(response.status).toBe(200);
    const { file_name, content, config } = response.body.data;
    expect(file_name).toBe("service.config.json");
    expect(JSON.parse(content)).toEqual(config);
    const bundle = (await bundleOf(fx.productId)).bundle;
    expect(config).toMatchObject({
      service_config_version: 1,
      environment: "live",
      product: { id: fx.productId },
      trust_anchor: {
        key_id: bundle.root_key_id,
        minimum_trust_bundle_sequence: bundle.sequence,
        development_root_public_key: null,
        signing_keys_pending_reason: null,
      },
      license_key_delivery: "manual",
    });
    expect(config.trust_anchor.trust_bundle_url).toEndWith(
      `/runtime/v1/products/${fx.productId}/trust-bundle`,
    );
    expect(config.entitlements).toEqual([
      { name: "export", type: "boolean", policies: [expect.any(String)] },
      { name: "seats", type: "json", policies: [expect.any(String)] },
    ]);
  });

  test("an archived product answers 409 PRODUCT_ARCHIVED", async () => {
    await t.call("DELETE", `/mgmt/v1/products/${fx.productId}`);
    const response = await t.call("GET", `/mgmt/v1/products/${fx.productId}/integration-config`);
    expect(response.status).toBe(409);
    expect(response.body.error.code).toBe("PRODUCT_ARCHIVED");
  });
});
