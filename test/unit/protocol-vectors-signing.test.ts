import { describe, expect, test } from "bun:test";
import { Value } from "@sinclair/typebox/value";
import { b64u, sha256Hex } from "../../src/crypto/encoding.ts";
import {
  type OnlineSigner,
  PREFIX,
  type ResponseAssertion,
  type SignedDelegation,
  signDelegation,
  signedResponseText,
  signResponse,
} from "../../src/crypto/envelope.ts";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { keyIdOf, parsePublicKey, signEd25519, thumbprint, verifySignature } from "../../src/crypto/keys.ts";
import { isoSeconds } from "../../src/domain/clock.ts";
import { type RuntimeFacts, runtimeDenial, SIGNED_DENIALS } from "../../src/domain/runtime-guards.ts";
import { ERROR_CODES, type ErrorCode } from "../../src/http/errors.ts";
import { signedString } from "../../src/modules/activations/model.ts";
import { leaseModels } from "../../src/modules/leases/model.ts";
import { ONLINE_KEY_PERIOD_SEC } from "../../src/modules/trust/service.ts";
import {
  type DelegationVector,
  DOC,
  EXPECTED_VECTORS,
  firstFailedStep,
  type JcsVector,
  type KeysVector,
  parsed,
  publicOf,
  type ResponseVector,
  type TrustBundleVector,
  utf8,
  vector,
  vectors,
} from "../support/protocol-vectors.ts";
import { ed25519FromHex, p256FromHex, readVectors } from "../support/vectors.ts";

/**
 * The vector blocks of docs/protocol.md themselves, and its encoding, key, JCS, trust bundle,
 * delegation and signed envelope vectors (§1-6, §16, §20), recomputed with the server's code and
 * accepted by the documented client's checks.
 */
describe("the vector blocks of docs/protocol.md", () => {
  test("the document holds exactly the expected vectors, each a JSON object", () => {
    expect([...vectors.keys()].sort()).toEqual([...EXPECTED_VECTORS]);
  });

  test("a vector block that is not JSON is reported instead of skipped", () => {
    expect(() => readVectors("```json vector=broken\n{ not json\n```\n")).toThrow(/not JSON/);
    expect(() => readVectors('```json vector=list\n["a"]\n```\n')).toThrow(/not a JSON object/);
    expect(() => readVectors("```json vector=Bad_Name\n{}\n```\n")).toThrow(/malformed name/);
    expect(() => readVectors("```json vector=twice\n{}\n```\n```json vector=twice\n{}\n```\n")).toThrow(
      /twice/,
    );
    expect(() => readVectors("```json vector=open\n{}\n")).toThrow(/could not be read/);
  });
});

describe("encodings and keys", () => {
  test("every fixed key has the documented key string, thumbprint and key id", () => {
    const { keys } = vector<KeysVector>("keys");
    expect(keys.some((k) => k.alg === "ed25519")).toBe(true);
    expect(keys.some((k) => k.alg === "p256")).toBe(true);
    for (const key of keys) {
      if (key.alg === "ed25519") {
        expect(publicOf(ed25519FromHex(key.seed_hex ?? ""))).toBe(key.public_key);
        expect(key.public_key).toMatch(/^ed25519:[A-Za-z0-9_-]{43}$/);
      } else {
        const { privateKey, point } = p256FromHex(key.scalar_hex ?? "");
        expect(publicOf(privateKey)).toBe(key.public_key);
        expect(key.public_key).toBe(`p256:${b64u.encode(point)}`);
        expect(point[0]).toBe(4);
        expect(point.length).toBe(65);
      }
      expect(parsePublicKey(key.public_key)?.alg).toBe(key.alg);
      expect(thumbprint(key.public_key)).toBe(key.thumbprint);
      expect(key.thumbprint).toBe(sha256Hex(utf8(key.public_key)));
      expect(keyIdOf(key.public_key)).toBe(key.key_id);
      expect(key.key_id).toBe(`k_${key.thumbprint.slice(0, 20)}`);
    }
  });

  test("JCS gives the documented canonical text for the example and for each number", () => {
    const jcs = vector<JcsVector>("jcs");
    expect(canonicalize(jcs.input)).toBe(jcs.canonical);
    expect(sha256Hex(jcs.canonical)).toBe(jcs.canonical_sha256);
    expect(jcs.numbers.length).toBeGreaterThan(0);
    for (const [text, canonical] of jcs.numbers) expect(canonicalize(JSON.parse(text))).toBe(canonical);
    const raw = /```json vector=jcs\n[\s\S]*?"input": (\{.*\}),\n/.exec(DOC)?.[1];
    expect(raw, "the jcs input keeps its raw number forms on one line").toContain("1.0");
  });
});

describe("trust bundle, delegation and signed envelope", () => {
  test("the trust bundle's root signature is the one the root key makes over the documented string", () => {
    const v = vector<TrustBundleVector>("trust-bundle");
    const rootKey = ed25519FromHex(v.root_seed_hex);
    expect(publicOf(rootKey)).toBe(v.root_public_key);
    expect(PREFIX.trustBundle + canonicalize(v.data.bundle)).toBe(v.signing_string);
    expect(signEd25519(rootKey, v.signing_string)).toBe(v.data.root_signature);
    expect(verifySignature(parsed(v.root_public_key), v.signing_string, v.data.root_signature)).toBe(true);
  });

  test("the trust bundle has the server's fields, key ids and key order", () => {
    const { bundle } = vector<TrustBundleVector>("trust-bundle").data;
    const root = vector<TrustBundleVector>("trust-bundle").root_public_key;
    expect(Object.keys(bundle).sort()).toEqual(
      ["environment", "issued_at", "product_id", "root_key_id", "sequence", "signing_keys", "v"].sort(),
    );
    expect(bundle.v).toBe(1);
    expect(bundle.root_key_id).toBe(keyIdOf(root));
    expect(bundle.signing_keys.map((k) => k.status).sort()).toEqual(["active", "compromised", "retired"]);
    for (const key of bundle.signing_keys) {
      expect(Object.keys(key).sort()).toEqual(["key_id", "not_after", "not_before", "public_key", "status"]);
      expect(key.key_id).toBe(keyIdOf(key.public_key));
      expect(key.not_after === null).toBe(key.status === "active");
    }
    const order = bundle.signing_keys.map((k) => k.not_before);
    expect(order).toEqual([...order].sort((a, b) => a - b));
  });

  test("the delegation signature is the one the server's signDelegation makes", () => {
    const v = vector<DelegationVector>("delegation");
    const parent = ed25519FromHex(v.parent_seed_hex);
    const online = publicOf(ed25519FromHex(v.online_seed_hex));
    expect(PREFIX.delegation + canonicalize(v.delegation)).toBe(v.signing_string);
    expect(signDelegation(v.delegation, parent)).toEqual({
      delegation: v.delegation,
      signature: v.signature,
    });
    expect(v.delegation.public_key).toBe(online);
    expect(v.delegation.online_key_id).toBe(keyIdOf(online));
    expect(v.delegation.parent_key_id).toBe(keyIdOf(publicOf(parent)));
    const active = vector<TrustBundleVector>("trust-bundle").data.bundle.signing_keys.find(
      (k) => k.status === "active",
    );
    expect(v.delegation.parent_key_id).toBe(active?.key_id ?? "");
  });

  test("a delegation starts at midnight UTC or its parent's birth, and ends two periods after midnight", () => {
    const { delegation } = vector<DelegationVector>("delegation");
    const parent = vector<TrustBundleVector>("trust-bundle").data.bundle.signing_keys.find(
      (k) => k.key_id === delegation.parent_key_id,
    );
    const dayStart = delegation.expires_at - 2 * ONLINE_KEY_PERIOD_SEC;
    expect(ONLINE_KEY_PERIOD_SEC).toBe(86_400);
    expect(dayStart % ONLINE_KEY_PERIOD_SEC).toBe(0);
    expect(delegation.issued_at).toBe(Math.max(dayStart, parent?.not_before ?? Number.NaN));
    expect(delegation.issued_at).toBeGreaterThan(dayStart);
    const { server_time } = vector<ResponseVector>("response-object").envelope.response_assertion;
    expect(Math.floor(server_time / ONLINE_KEY_PERIOD_SEC) * ONLINE_KEY_PERIOD_SEC).toBe(dayStart);
  });

  for (const name of ["response-object", "response-string", "response-denial"] as const) {
    test(`the ${name} envelope is exactly what the server's signResponse produces`, () => {
      const v = vector<ResponseVector>(name);
      const d = vector<DelegationVector>("delegation");
      const signedDelegation: SignedDelegation = { delegation: d.delegation, signature: d.signature };
      const assertion: ResponseAssertion = v.envelope.response_assertion;
      const signer: OnlineSigner = {
        productId: assertion.product_id,
        keyId: d.delegation.online_key_id,
        parentKeyId: d.delegation.parent_key_id,
        privateKey: ed25519FromHex(v.online_seed_hex),
        delegation: signedDelegation,
      };
      const body = "error" in v.envelope ? v.envelope.error : v.envelope.data;
      expect(canonicalize(body)).toBe(v.body_canonical);
      expect(assertion.body_sha256).toBe(sha256Hex(utf8(v.body_canonical)));
      expect(PREFIX.response + canonicalize(assertion)).toBe(v.signing_string);
      const signed = signResponse(signer, {
        requestId: assertion.request_id,
        nonce: assertion.nonce,
        serverTime: assertion.server_time,
        status: assertion.status,
        body,
      });
      expect(signed).toEqual({
        response_assertion: assertion,
        response_signature: v.envelope.response_signature,
        signing_delegation: v.envelope.signing_delegation,
      });
      expect(Object.keys(assertion)).toEqual(Object.keys(signed.response_assertion));
      expect(Object.keys(v.envelope).sort()).toEqual(
        [
          "error" in v.envelope ? "error" : "data",
          "response_assertion",
          "response_signature",
          "signing_delegation",
        ].sort(),
      );
      if ("data" in v.envelope) {
        // The text the server sends for a success is this same envelope, with the data as its JCS.
        const text = signedResponseText(signer, {
          requestId: assertion.request_id,
          nonce: assertion.nonce,
          serverTime: assertion.server_time,
          status: assertion.status,
          body,
        });
        expect(JSON.parse(text)).toEqual(v.envelope);
        expect(text).toContain(`"data":${v.body_canonical},`);
      }
    });
  }

  test("the success envelopes match the server's response schemas", () => {
    expect(Value.Check(leaseModels["lease.result"], vector<ResponseVector>("response-object").envelope)).toBe(
      true,
    );
    expect(Value.Check(signedString(), vector<ResponseVector>("response-string").envelope)).toBe(true);
  });

  test("the time data is the ISO 8601 form of server_time with whole seconds", () => {
    const { envelope } = vector<ResponseVector>("response-string");
    expect(envelope.data).toBe(isoSeconds(envelope.response_assertion.server_time));
    expect(envelope.data).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/);
    expect(vector<ResponseVector>("response-string").body_canonical).toBe(JSON.stringify(envelope.data));
  });

  test("the signed denial carries a complete error envelope of a signed code", () => {
    const { envelope } = vector<ResponseVector>("response-denial");
    const error = envelope.error ?? {};
    expect(Object.keys(error).sort()).toEqual(
      ["code", "details", "doc_url", "message", "request_id", "retryable"].sort(),
    );
    const code = error.code as ErrorCode;
    expect(SIGNED_DENIALS.has(code)).toBe(true);
    expect(envelope.response_assertion.status).toBe(ERROR_CODES[code].status);
    expect(error.request_id).toBe(envelope.response_assertion.request_id);
    expect(error.doc_url).toBe(`https://licensing.example.com/docs/errors#${code}`);
  });

  test("the signed denial names, inside its signed error object, the activation it answers", () => {
    const bundle = vector<TrustBundleVector>("trust-bundle");
    const { envelope } = vector<ResponseVector>("response-denial");
    const activationId = vector<{ activation_id: string }>("device-proof-ed25519").activation_id;
    expect(envelope.error?.details).toEqual({ activation_id: activationId });
    const expected = {
      status: envelope.response_assertion.status,
      nonce: envelope.response_assertion.nonce,
      productId: bundle.data.bundle.product_id,
    };
    const trust = { bundle: bundle.data, rootPublicKey: bundle.root_public_key, minimumSequence: 3 };
    const subject = { activation_id: activationId };
    expect(firstFailedStep(envelope, { ...expected, subject }, trust)).toBeNull();
    // Another activation's denial for the same nonce verifies up to its body, and is not ours.
    const other = { activation_id: "act_01JZ8X5A7C9E1G3H5J7K9M1N3Q" };
    expect(firstFailedStep(envelope, { ...expected, subject: other }, trust)).toBe("denial subject");
    const moved = structuredClone(envelope);
    (moved.error as { details: unknown }).details = other;
    expect(firstFailedStep(moved, { ...expected, subject: other }, trust)).toBe("body hash");
  });

  test("the documented signed denials are exactly the server's", () => {
    const section = /## 16\. Signed denials([\s\S]*?)\n## /.exec(DOC)?.[1] ?? "";
    const documented = [...section.matchAll(/^\| `([A-Z_]+)` \| (\d{3}) \|/gm)].map(
      (m) => [m[1] as ErrorCode, Number(m[2])] as const,
    );
    expect(documented.map(([code]) => code).sort()).toEqual([...SIGNED_DENIALS].sort());
    for (const [code, status] of documented) expect(ERROR_CODES[code].status as number).toBe(status);
  });

  test("the documented denial precedence is the order the server's guards apply", () => {
    const sentence = /Precedence when several apply: ([^.]*)\./.exec(DOC)?.[1] ?? "";
    const order = sentence.split("›").map((part) => part.replace(/[`\s]/g, ""));
    expect(order).toEqual([
      "LICENSE_REVOKED",
      "LICENSE_EXPIRED",
      "LICENSE_BLOCKED",
      "DEVICE_BLOCKED",
      "ACTIVATION_DEACTIVATED",
      "LICENSE_SUSPENDED",
    ]);
    const now = new Date(1_767_312_345_000);
    const past = new Date(now.getTime() - 1000);
    const facts = (from: number): RuntimeFacts => ({
      license: {
        status: from === 0 ? "revoked" : from >= 4 ? "suspended" : "active",
        expiresAt: from <= 1 ? past : null,
        blocked: from <= 2,
      },
      activation: { status: from <= 4 ? "deactivated" : "active", deviceBlocked: from <= 3 },
    });
    order.forEach((code, from) => {
      expect(runtimeDenial("lease", facts(from), now)).toBe(code as ErrorCode);
    });
    const suspendedAndPast: RuntimeFacts = {
      license: { status: "suspended", expiresAt: past, blocked: false },
      activation: { status: "active", deviceBlocked: false },
    };
    expect(runtimeDenial("heartbeat", suspendedAndPast, now)).toBeNull();
    expect(runtimeDenial("deactivate", facts(0), now)).toBe("ACTIVATION_DEACTIVATED");
  });

  test("the signing prefixes in use and reserved are exactly the server's", () => {
    const section = /## 20\. Reserved formats([\s\S]*?)\n## /.exec(DOC)?.[1] ?? "";
    const documented = [...new Set([...section.matchAll(/`(Service-[A-Za-z-]+-v1)\\n`/g)].map((m) => m[1]))];
    expect(documented.sort()).toEqual(
      Object.values(PREFIX)
        .map((p) => p.replace(/\n$/, ""))
        .sort(),
    );
  });

  test("a client following the documented order accepts every documented response", () => {
    const bundle = vector<TrustBundleVector>("trust-bundle");
    for (const name of ["response-object", "response-string", "response-denial"] as const) {
      const { envelope } = vector<ResponseVector>(name);
      const expected = {
        status: envelope.response_assertion.status,
        nonce: envelope.response_assertion.nonce,
        productId: bundle.data.bundle.product_id,
      };
      const trust = { bundle: bundle.data, rootPublicKey: bundle.root_public_key, minimumSequence: 3 };
      expect(firstFailedStep(envelope, expected, trust)).toBeNull();
    }
  });

  test("a client following the documented order refuses tampered responses at the right step", () => {
    const bundle = vector<TrustBundleVector>("trust-bundle");
    const { envelope } = vector<ResponseVector>("response-object");
    const expected = {
      status: 201,
      nonce: envelope.response_assertion.nonce,
      productId: bundle.data.bundle.product_id,
    };
    const trust = { bundle: bundle.data, rootPublicKey: bundle.root_public_key, minimumSequence: 3 };
    const copy = () => structuredClone(envelope);
    const tamperedData = copy();
    (tamperedData.data as { heartbeat_in: number }).heartbeat_in = 301;
    expect(firstFailedStep(tamperedData, expected, trust)).toBe("body hash");
    expect(firstFailedStep(envelope, { ...expected, nonce: "another-nonce-0000000000" }, trust)).toBe(
      "request binding",
    );
    expect(firstFailedStep(envelope, { ...expected, status: 200 }, trust)).toBe("request binding");
    const tamperedAssertion = copy();
    tamperedAssertion.response_assertion.server_time += 1;
    expect(firstFailedStep(tamperedAssertion, expected, trust)).toBe("response signature");
    const tamperedDelegation = copy();
    tamperedDelegation.signing_delegation.delegation.expires_at += 86_400;
    expect(firstFailedStep(tamperedDelegation, expected, trust)).toBe("delegation signature");
    expect(firstFailedStep(envelope, expected, { ...trust, minimumSequence: 4 })).toBe("bundle scope");
    const compromised = structuredClone(bundle.data);
    for (const key of compromised.bundle.signing_keys)
      if (key.status === "active") key.status = "compromised";
    compromised.root_signature = signEd25519(
      ed25519FromHex(bundle.root_seed_hex),
      PREFIX.trustBundle + canonicalize(compromised.bundle),
    );
    expect(firstFailedStep(envelope, expected, { ...trust, bundle: compromised })).toBe("parent key status");
  });
});
