import { describe, expect, test } from "bun:test";
import { importJWK, jwtVerify } from "jose";
import type { SignedDelegation } from "../../src/crypto/envelope.ts";
import { keyIdOf } from "../../src/crypto/keys.ts";
import { CERTIFICATE_NBF_LEEWAY_SEC } from "../../src/modules/activations/certificate.ts";
import { ONLINE_KEY_PERIOD_SEC } from "../../src/modules/trust/service.ts";
import { TestDevice } from "../support/device.ts";
import { BASE_URL, createTestContext } from "../support/harness.ts";
import { DOC, firstFailedStep, type TrustBundleVector } from "../support/protocol-vectors.ts";
import { activate, heartbeatPath, proofCall, runtimeFixture } from "../support/runtime.ts";

/**
 * A running server against docs/protocol.md: its trust bundle, signed answers, certificates and
 * integration config pass the documented client checks and match the documented fields (§6, §10, §15).
 */
describe("a running server against this document", () => {
  test("its trust bundle, signed answers and certificates pass the documented client checks", async () => {
    const t = createTestContext();
    try {
      const fx = await runtimeFixture(t, {
        policy: {
          license_type: "subscription",
          heartbeat_sec: 3600,
          fail_mode: "open",
          network_grace_sec: 600,
        },
      });
      const config = (await t.call("GET", `/mgmt/v1/products/${fx.productId}/integration-config`)).body.data
        .config;
      const bundle = (await t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, { key: null }))
        .body.data as TrustBundleVector["data"];
      expect(config.trust_anchor.key_id).toBe(keyIdOf(config.trust_anchor.root_public_key));
      const trust = {
        bundle,
        rootPublicKey: config.trust_anchor.root_public_key as string,
        minimumSequence: config.trust_anchor.minimum_trust_bundle_sequence as number,
      };
      const active = bundle.bundle.signing_keys.find((k) => k.status === "active");

      const device = new TestDevice("p256");
      const activation = await activate(t, device, fx);
      expect(activation.status).toBe(201);
      const expected = { productId: fx.productId };
      const sent = { status: 201, nonce: activation.body.response_assertion.nonce, ...expected };
      expect(firstFailedStep(activation.body, sent, trust)).toBeNull();

      const { delegation } = activation.body.signing_delegation as SignedDelegation;
      const dayStart =
        Math.floor(activation.body.response_assertion.server_time / ONLINE_KEY_PERIOD_SEC) *
        ONLINE_KEY_PERIOD_SEC;
      expect(delegation.issued_at).toBe(Math.max(dayStart, active?.not_before ?? Number.NaN));
      expect(delegation.expires_at).toBe(dayStart + 2 * ONLINE_KEY_PERIOD_SEC);

      const { activation_id: activationId, certificate } = activation.body.data;
      const key = await importJWK({ kty: "OKP", crv: "Ed25519", x: active?.public_key.slice(8) }, "EdDSA");
      const { payload, protectedHeader } = await jwtVerify(certificate, key, {
        issuer: BASE_URL,
        audience: fx.productId,
        typ: "service-license+jwt",
      });
      expect(protectedHeader).toEqual({
        alg: "EdDSA",
        kid: active?.key_id ?? "",
        typ: "service-license+jwt",
      });
      expect(payload).toMatchObject({
        sub: fx.licenseId,
        activation_id: activationId,
        cnf: { jkt: device.thumbprint },
        machine_info_digest: activation.body.data.machine_info_digest,
        heartbeat: { required: true, interval_sec: 3600, grace_sec: 600 },
      });
      expect(payload.nbf).toBe((payload.iat ?? 0) - CERTIFICATE_NBF_LEEWAY_SEC);

      const heartbeat = await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
        machine_info_digest: activation.body.data.machine_info_digest,
      });
      expect(heartbeat.status).toBe(200);
      const proofNonce = heartbeat.body.response_assertion.nonce;
      expect(
        firstFailedStep(heartbeat.body, { status: 200, nonce: proofNonce, ...expected }, trust),
      ).toBeNull();

      const nonce = "documented-nonce-0000000001";
      const time = await t.call("POST", "/runtime/v1/time", {
        key: null,
        body: { product_id: fx.productId, nonce },
      });
      expect(firstFailedStep(time.body, { status: 200, nonce, ...expected }, trust)).toBeNull();
      expect(time.body.data).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/);

      const gone = `/runtime/v1/activations/${activationId}`;
      expect((await proofCall(t, device, "DELETE", gone, activationId)).status).toBe(200);
      const denial = await proofCall(t, device, "DELETE", gone, activationId);
      expect(denial.status).toBe(410);
      const denialNonce = denial.body.response_assertion.nonce;
      expect(
        firstFailedStep(
          denial.body,
          { status: 410, nonce: denialNonce, ...expected, subject: { activation_id: activationId } },
          trust,
        ),
      ).toBeNull();
    } finally {
      t.close();
    }
  });

  test("the integration config has exactly the fields the document lists", async () => {
    const t = createTestContext();
    try {
      const fx = await runtimeFixture(t);
      const { config } = (await t.call("GET", `/mgmt/v1/products/${fx.productId}/integration-config`)).body
        .data;
      const section = /## 15\. The integration config file([\s\S]*?)\n## /.exec(DOC)?.[1] ?? "";
      const documented = [...section.matchAll(/^\| `([a-z_.]+)` \|/gm)].map((m) => m[1]);
      const actual = Object.entries(config as Record<string, unknown>).flatMap(([name, value]) =>
        name === "trust_anchor" ? Object.keys(value as object).map((inner) => `${name}.${inner}`) : [name],
      );
      expect(documented.sort()).toEqual(actual.sort());
    } finally {
      t.close();
    }
  });
});
