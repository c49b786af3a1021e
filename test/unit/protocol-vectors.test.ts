import { describe, expect, test } from "bun:test";
import { createPublicKey, type KeyObject } from "node:crypto";
import { readFileSync } from "node:fs";
import { Value } from "@sinclair/typebox/value";
import { compactVerify, importJWK, jwtVerify } from "jose";
import { b64u, sha256Hex } from "../../src/crypto/encoding.ts";
import {
  type Delegation,
  type EnvelopeSignature,
  type OnlineSigner,
  PREFIX,
  type ResponseAssertion,
  type SignedDelegation,
  signDelegation,
  signedResponseText,
  signResponse,
} from "../../src/crypto/envelope.ts";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { signCompactJws } from "../../src/crypto/jws.ts";
import {
  keyIdOf,
  parsePublicKey,
  publicKeyText,
  signEd25519,
  thumbprint,
  verifySignature,
} from "../../src/crypto/keys.ts";
import { type RuntimeFacts, runtimeDenial, SIGNED_DENIALS } from "../../src/domain/runtime-guards.ts";
import {
  CLOCK_SKEW_SEC,
  DeviceProofVerifier,
  deviceProofMessage,
  readDeviceProofHeaders,
} from "../../src/http/device-proof.ts";
import { ApiError, ERROR_CODES, type ErrorCode } from "../../src/http/errors.ts";
import {
  CERTIFICATE_NBF_LEEWAY_SEC,
  type CertificateSubject,
  issueCertificate,
} from "../../src/modules/activations/certificate.ts";
import { machineInfoCheck, machineInfoDigest } from "../../src/modules/activations/machine.ts";
import {
  ActivationCreate,
  type ActivationCreateBody,
  Heartbeat,
  type HeartbeatBody,
  signedString,
} from "../../src/modules/activations/model.ts";
import { idempotentPartOf } from "../../src/modules/activations/service.ts";
import { leaseModels } from "../../src/modules/leases/model.ts";
import { isoSeconds } from "../../src/modules/trust/index.ts";
import {
  ONLINE_KEY_PERIOD_SEC,
  type TrustBundleBody,
  type TrustService,
} from "../../src/modules/trust/service.ts";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { TestDevice } from "../support/device.ts";
import { BASE_URL, createTestContext } from "../support/harness.ts";
import { activate, heartbeatPath, proofCall, runtimeFixture } from "../support/runtime.ts";
import { ed25519FromHex, p256FromHex, readVectors } from "../support/vectors.ts";

const DOC_PATH = new URL("../../docs/protocol.md", import.meta.url);
const DOC = readFileSync(DOC_PATH, "utf8");

/** Every vector the document must carry; a missing or extra block fails the first test. */
const EXPECTED_VECTORS = [
  "activation",
  "certificate",
  "certificate-rules",
  "delegation",
  "device-proof-ed25519",
  "device-proof-p256",
  "jcs",
  "keys",
  "machine-info-rules",
  "offline-package",
  "offline-request",
  "response-denial",
  "response-object",
  "response-string",
  "sealed-file",
  "trial-confirm",
  "trust-bundle",
  "webhook-delivery",
] as const;
type VectorName = (typeof EXPECTED_VECTORS)[number];

const vectors = readVectors(DOC);

function vector<T>(name: VectorName): T {
  const found = vectors.get(name);
  if (!found) throw new Error(`docs/protocol.md has no vector "${name}"`);
  return found as T;
}

interface KeysVector {
  keys: {
    role: string;
    alg: "ed25519" | "p256";
    seed_hex?: string;
    scalar_hex?: string;
    public_key: string;
    thumbprint: string;
    key_id: string;
  }[];
}
interface JcsVector {
  input: unknown;
  canonical: string;
  canonical_sha256: string;
  numbers: [string, string][];
}
interface TrustBundleVector {
  root_seed_hex: string;
  root_public_key: string;
  data: { bundle: TrustBundleBody; root_signature: string };
  signing_string: string;
}
interface DelegationVector {
  parent_seed_hex: string;
  online_seed_hex: string;
  delegation: Delegation;
  signing_string: string;
  signature: string;
}
interface ResponseVector {
  online_seed_hex: string;
  body_canonical: string;
  signing_string: string;
  envelope: EnvelopeSignature & { data?: unknown; error?: Record<string, unknown> };
}
interface ActivationVector {
  device_seed_hex: string;
  idempotency_key: string;
  body: ActivationCreateBody;
  signing_string: string;
  machine_info_digest: string;
  idempotency_part: Record<string, unknown>;
  idempotency_fingerprint: string;
}
interface DeviceProofVector {
  device_seed_hex?: string;
  device_scalar_hex?: string;
  public_key?: string;
  method: string;
  path_and_query: string;
  activation_id: string;
  timestamp: number;
  nonce: string;
  body_text: string;
  body_sha256: string;
  signing_string: string;
  signature: string;
  headers?: Record<string, string>;
}
interface IssuedFrom {
  now: number;
  issuer: string;
  license: {
    id: string;
    product_id: string;
    status: "active" | "suspended" | "revoked";
    license_type: string;
    expires_at: number | null;
    entitlements: Record<string, unknown>;
    max_concurrent_override: number | null;
  };
  policy: Record<string, unknown> & { id: string };
  activation_id: string;
  device_signing_public_key: string;
  machine_info_digest: string;
}
interface CertificateVector {
  signing_seed_hex: string;
  public_key: string;
  public_jwk: { kty: string; crv: string; x: string };
  header: { alg: string; kid: string; typ: string };
  claims: Record<string, unknown> & {
    iss: string;
    sub: string;
    aud: string;
    iat: number;
    nbf: number;
    exp: number;
    jti: string;
    activation_id: string;
    cnf: { jkt: string };
    machine_info_digest: string;
    license: { expires_at: number | null };
  };
  jws: string;
  issued_from: IssuedFrom;
}
interface CertificateRulesVector {
  defaults: string;
  cases: {
    name: string;
    now: number;
    license: Partial<IssuedFrom["license"]>;
    policy: Record<string, unknown>;
    expect: Record<string, unknown>;
  }[];
}
interface MachineInfoRulesVector {
  baseline_machine_info_digest: string;
  now: number;
  cases: {
    name: string;
    profile: "standard" | "strict" | "relaxed";
    baseline_age_sec: number;
    body: HeartbeatBody;
    expect: { digest: string; new_baseline: boolean } | { error: string; reason: string };
  }[];
}

const utf8 = (text: string) => new TextEncoder().encode(text);
const publicOf = (key: KeyObject) => publicKeyText(createPublicKey(key));
const parsed = (text: string) => {
  const info = parsePublicKey(text);
  if (!info) throw new Error(`not a contract key string: ${text}`);
  return info;
};
const decodeSegment = (segment: string): unknown =>
  JSON.parse(Buffer.from(segment, "base64url").toString("utf8"));

/** What the documented client does (docs/protocol.md §6), step by step; the first failed step. */
function firstFailedStep(
  body: ResponseVector["envelope"],
  expected: { status: number; nonce: string; productId: string },
  trust: { bundle: TrustBundleVector["data"]; rootPublicKey: string; minimumSequence: number },
): string | null {
  const root = parsed(trust.rootPublicKey);
  const { bundle, root_signature } = trust.bundle;
  if (!verifySignature(root, PREFIX.trustBundle + canonicalize(bundle), root_signature))
    return "bundle signature";
  if (bundle.v !== 1 || bundle.root_key_id !== keyIdOf(trust.rootPublicKey)) return "bundle root";
  if (bundle.product_id !== expected.productId || bundle.sequence < trust.minimumSequence)
    return "bundle scope";
  const { delegation, signature } = body.signing_delegation;
  const parent = bundle.signing_keys.find((k) => k.key_id === delegation.parent_key_id);
  if (
    !parent ||
    parent.key_id !== keyIdOf(parent.public_key) ||
    parent.status === "compromised" ||
    parent.not_before > delegation.issued_at ||
    (parent.not_after !== null && parent.not_after < delegation.issued_at)
  )
    return "parent key status";
  if (!verifySignature(parsed(parent.public_key), PREFIX.delegation + canonicalize(delegation), signature))
    return "delegation signature";
  const assertion = body.response_assertion;
  if (
    delegation.v !== 1 ||
    delegation.purpose !== "runtime-response" ||
    delegation.product_id !== expected.productId ||
    delegation.expires_at - delegation.issued_at < 0 ||
    delegation.expires_at - delegation.issued_at > 7 * 86_400 ||
    assertion.server_time < delegation.issued_at ||
    assertion.server_time > delegation.expires_at ||
    delegation.online_key_id !== keyIdOf(delegation.public_key)
  )
    return "delegation fields";
  if (delegation.online_key_id !== assertion.key_id || delegation.parent_key_id !== assertion.parent_key_id)
    return "binding";
  if (
    !verifySignature(
      parsed(delegation.public_key),
      PREFIX.response + canonicalize(assertion),
      body.response_signature,
    )
  )
    return "response signature";
  if (
    assertion.v !== 1 ||
    assertion.nonce !== expected.nonce ||
    assertion.status !== expected.status ||
    assertion.product_id !== expected.productId
  )
    return "request binding";
  const signedBody = "error" in body ? body.error : body.data;
  if (assertion.body_sha256 !== sha256Hex(canonicalize(signedBody))) return "body hash";
  return null;
}

function subjectFrom(from: IssuedFrom): CertificateSubject {
  const license = {
    id: from.license.id,
    productId: from.license.product_id,
    status: from.license.status,
    licenseType: from.license.license_type,
    expiresAt: from.license.expires_at === null ? null : new Date(from.license.expires_at * 1000),
    entitlements: from.license.entitlements,
    maxConcurrentOverride: from.license.max_concurrent_override,
  } as unknown as CertificateSubject["license"];
  return {
    license,
    policy: from.policy as unknown as CertificateSubject["policy"],
    activationId: from.activation_id,
    deviceThumbprint: thumbprint(from.device_signing_public_key),
    machineInfoDigest: from.machine_info_digest,
  };
}

/** The server's own certificate code, with the documented key standing in for the keystore. */
function serverCertificate(from: IssuedFrom, signingSeedHex: string): Record<string, unknown> {
  const privateKey = ed25519FromHex(signingSeedHex);
  const trust = { signingKey: () => ({ keyId: keyIdOf(publicOf(privateKey)), privateKey }) };
  const { certificate } = issueCertificate(
    trust as unknown as TrustService,
    from.issuer,
    subjectFrom(from),
    new Date(from.now * 1000),
  );
  const [header, payload, signature] = certificate.split(".") as [string, string, string];
  expect(
    verifySignature(parsed(publicOf(privateKey)), `${header}.${payload}`, signature),
    "the server's certificate verifies with its signing key",
  ).toBe(true);
  return decodeSegment(payload) as Record<string, unknown>;
}

function thrownBy(run: () => unknown): ApiError {
  try {
    run();
  } catch (error) {
    if (error instanceof ApiError) return error;
    throw error;
  }
  throw new Error("expected an ApiError");
}

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

describe("activation", () => {
  test("the activation proof is the one the device key makes over the documented string", () => {
    const v = vector<ActivationVector>("activation");
    const device = ed25519FromHex(v.device_seed_hex);
    expect(v.body.device_signing_public_key).toBe(publicOf(device));
    const { device_proof, ...signedPart } = v.body;
    expect(PREFIX.activationProof + canonicalize(signedPart)).toBe(v.signing_string);
    expect(signEd25519(device, v.signing_string)).toBe(device_proof);
    expect(verifySignature(parsed(v.body.device_signing_public_key), v.signing_string, device_proof)).toBe(
      true,
    );
  });

  test("the activation body passes the server's schema and gives the documented digest", () => {
    const v = vector<ActivationVector>("activation");
    expect(Value.Check(ActivationCreate, v.body)).toBe(true);
    expect(machineInfoDigest(v.body.machine_info)).toBe(v.machine_info_digest);
    expect(v.machine_info_digest).toBe(sha256Hex(canonicalize(v.body.machine_info)));
    expect(parsePublicKey(v.body.device_kem_public_key)?.alg).toBe("p256");
    expect(v.idempotency_key).toMatch(/^[\x21-\x7E]{16,255}$/);
  });

  test("idempotency compares the body without nonce, proof, client time and request id", () => {
    const v = vector<ActivationVector>("activation");
    expect(idempotentPartOf(v.body)).toEqual(v.idempotency_part as ReturnType<typeof idempotentPartOf>);
    expect(sha256Hex(canonicalize(v.idempotency_part))).toBe(v.idempotency_fingerprint);
    const retry = { ...v.body, nonce: "a-fresh-nonce-for-the-retry", client_time: v.body.client_time + 30 };
    retry.request_id = "another-request";
    retry.device_proof = "x".repeat(86);
    expect(sha256Hex(canonicalize(idempotentPartOf(retry)))).toBe(v.idempotency_fingerprint);
  });
});

describe("device proof", () => {
  test("the Ed25519 device proof has the documented signing string and signature", () => {
    const v = vector<DeviceProofVector>("device-proof-ed25519");
    const device = ed25519FromHex(v.device_seed_hex ?? "");
    expect(sha256Hex(utf8(v.body_text))).toBe(v.body_sha256);
    const message = deviceProofMessage({
      method: v.method,
      pathAndQuery: v.path_and_query,
      activationId: v.activation_id,
      timestamp: v.timestamp,
      nonce: v.nonce,
      body: utf8(v.body_text),
    });
    expect(message).toBe(v.signing_string);
    expect(message).toBe(
      [
        "Service-Device-Proof-v1",
        v.method,
        v.path_and_query,
        v.activation_id,
        String(v.timestamp),
        v.nonce,
        v.body_sha256,
      ].join("\n"),
    );
    expect(signEd25519(device, message)).toBe(v.signature);
  });

  test("the documented heartbeat headers and body pass the server's checks once, then count as a replay", () => {
    const v = vector<DeviceProofVector>("device-proof-ed25519");
    const headers = v.headers ?? {};
    expect(headers["X-Service-Signature"]).toBe(v.signature);
    const proof = readDeviceProofHeaders(new Headers(headers));
    expect(proof).toEqual({
      activationId: v.activation_id,
      timestamp: v.timestamp,
      nonce: v.nonce,
      signature: v.signature,
    });
    expect(Value.Check(Heartbeat, JSON.parse(v.body_text))).toBe(true);
    const store = openStore(":memory:");
    try {
      migrate(store.sqlite);
      const verifier = new DeviceProofVerifier(store.sqlite);
      const key = parsed(publicOf(ed25519FromHex(v.device_seed_hex ?? "")));
      const request = { method: v.method, pathAndQuery: v.path_and_query, body: utf8(v.body_text) };
      verifier.verify(proof, request, key, v.timestamp + CLOCK_SKEW_SEC);
      const replay = thrownBy(() => verifier.verify(proof, request, key, v.timestamp));
      expect([replay.code, replay.details.reason]).toEqual(["DEVICE_PROOF_INVALID", "replayed"]);
      const late = thrownBy(() => verifier.verify(proof, request, key, v.timestamp + CLOCK_SKEW_SEC + 1));
      expect([late.code, late.status, late.details.server_time]).toEqual([
        "CLOCK_SKEW",
        401,
        v.timestamp + CLOCK_SKEW_SEC + 1,
      ]);
      const otherBody = { ...request, body: utf8(`${v.body_text} `) };
      const fresh = { ...proof, nonce: "another-nonce-that-is-fresh" };
      const bad = thrownBy(() => verifier.verify(fresh, otherBody, key, v.timestamp));
      expect([bad.code, bad.details.reason]).toEqual(["DEVICE_PROOF_INVALID", "invalid_signature"]);
    } finally {
      store.close();
    }
  });

  test("the P-256 device proof's documented signature verifies over the documented string", () => {
    const v = vector<DeviceProofVector>("device-proof-p256");
    const { privateKey } = p256FromHex(v.device_scalar_hex ?? "");
    expect(publicOf(privateKey)).toBe(v.public_key ?? "");
    expect(v.body_text).toBe("");
    expect(v.body_sha256).toBe(sha256Hex(new Uint8Array(0)));
    const message = deviceProofMessage({
      method: v.method,
      pathAndQuery: v.path_and_query,
      activationId: v.activation_id,
      timestamp: v.timestamp,
      nonce: v.nonce,
      body: new Uint8Array(0),
    });
    expect(message).toBe(v.signing_string);
    const key = parsed(v.public_key ?? "");
    expect(key.alg).toBe("p256");
    expect(verifySignature(key, message, v.signature)).toBe(true);
    expect(verifySignature(key, `${message}0`, v.signature)).toBe(false);
  });
});

describe("license certificate", () => {
  test("the certificate is exactly what the server's signCompactJws makes from the documented header and claims", () => {
    const v = vector<CertificateVector>("certificate");
    const key = ed25519FromHex(v.signing_seed_hex);
    expect(publicOf(key)).toBe(v.public_key);
    expect(signCompactJws(v.header, v.claims, key)).toBe(v.jws);
    const [header, payload] = v.jws.split(".") as [string, string, string];
    expect(decodeSegment(header)).toEqual(v.header);
    expect(decodeSegment(payload)).toEqual(v.claims);
  });

  test("jose verifies the documented certificate with the Ed25519 public key as a JWK", async () => {
    const v = vector<CertificateVector>("certificate");
    expect(`ed25519:${v.public_jwk.x}`).toBe(v.public_key);
    const key = await importJWK(v.public_jwk, "EdDSA");
    const compact = await compactVerify(v.jws, key);
    expect(compact.protectedHeader).toEqual(v.header);
    const { payload, protectedHeader } = await jwtVerify(v.jws, key, {
      algorithms: ["EdDSA"],
      issuer: v.claims.iss,
      audience: v.claims.aud,
      subject: v.claims.sub,
      typ: "service-license+jwt",
      currentDate: new Date(v.claims.iat * 1000),
    });
    expect(protectedHeader).toEqual(v.header);
    expect(payload).toEqual(v.claims);
  });

  test("jose accepts the certificate from nbf and refuses it before nbf and from exp", async () => {
    const v = vector<CertificateVector>("certificate");
    const key = await importJWK(v.public_jwk, "EdDSA");
    const at = (sec: number) => jwtVerify(v.jws, key, { currentDate: new Date(sec * 1000) });
    await expect(at(v.claims.nbf)).resolves.toBeDefined();
    await expect(at(v.claims.exp - 1)).resolves.toBeDefined();
    await expect(at(v.claims.nbf - 1)).rejects.toThrow();
    await expect(at(v.claims.exp)).rejects.toThrow();
  });

  test("the certificate's key, device binding and times follow the documented rules", () => {
    const v = vector<CertificateVector>("certificate");
    const bundleKey = vector<TrustBundleVector>("trust-bundle").data.bundle.signing_keys.find(
      (k) => k.key_id === v.header.kid,
    );
    expect(bundleKey?.status).toBe("active");
    expect(bundleKey?.public_key).toBe(v.public_key);
    expect(v.header.kid).toBe(keyIdOf(v.public_key));
    const activation = vector<ActivationVector>("activation");
    expect(v.claims.cnf.jkt).toBe(thumbprint(activation.body.device_signing_public_key));
    expect(v.claims.machine_info_digest).toBe(activation.machine_info_digest);
    expect(v.claims.nbf).toBe(v.claims.iat - CERTIFICATE_NBF_LEEWAY_SEC);
    expect(CERTIFICATE_NBF_LEEWAY_SEC).toBe(300);
    expect(v.claims.exp).toBeLessThanOrEqual(v.claims.license.expires_at ?? Number.POSITIVE_INFINITY);
    expect(b64u.decode(v.claims.jti).length).toBe(16);
  });

  test("the server's certificate code issues the documented claims in the documented order", () => {
    const v = vector<CertificateVector>("certificate");
    const claims = serverCertificate(v.issued_from, v.signing_seed_hex);
    expect(claims.jti).toMatch(/^[A-Za-z0-9_-]{22}$/);
    expect({ ...claims, jti: v.claims.jti }).toEqual(v.claims);
    expect(Object.keys(claims)).toEqual(Object.keys(v.claims));
    expect(JSON.stringify({ ...claims, jti: v.claims.jti })).toBe(JSON.stringify(v.claims));
  });

  test("each certificate rule case gives the documented times, license state and grace", () => {
    const base = vector<CertificateVector>("certificate");
    const rules = vector<CertificateRulesVector>("certificate-rules");
    expect(rules.defaults).toBe("certificate.issued_from");
    expect(rules.cases.length).toBeGreaterThan(0);
    for (const c of rules.cases) {
      const from: IssuedFrom = {
        ...base.issued_from,
        now: c.now,
        license: { ...base.issued_from.license, ...c.license },
        policy: { ...base.issued_from.policy, ...c.policy },
      };
      const claims = serverCertificate(from, base.signing_seed_hex) as {
        license: Record<string, unknown>;
      } & Record<string, unknown>;
      const got = {
        iat: claims.iat,
        nbf: claims.nbf,
        exp: claims.exp,
        license: {
          status: claims.license.status,
          type: claims.license.type,
          expires_at: claims.license.expires_at,
        },
        heartbeat: claims.heartbeat,
      };
      expect(got as Record<string, unknown>, c.name).toEqual(c.expect);
    }
  });
});

describe("heartbeat machine_info", () => {
  test("each machine_info case gives the documented digest or MACHINE_INFO_REQUIRED reason", () => {
    const rules = vector<MachineInfoRulesVector>("machine-info-rules");
    expect(rules.cases.length).toBeGreaterThan(0);
    const now = new Date(rules.now * 1000);
    for (const c of rules.cases) {
      expect(Value.Check(Heartbeat, c.body), c.name).toBe(true);
      const baseline = {
        machineInfoDigest: rules.baseline_machine_info_digest,
        machineBaselineAt: new Date((rules.now - c.baseline_age_sec) * 1000),
      };
      let got: MachineInfoRulesVector["cases"][number]["expect"];
      try {
        const result = machineInfoCheck(baseline, c.body, c.profile, now);
        got = { digest: result.digest, new_baseline: result.changes.machineBaselineAt !== undefined };
      } catch (error) {
        if (!(error instanceof ApiError)) throw error;
        got = { error: error.code, reason: String(error.details.reason) };
      }
      expect(got as Record<string, unknown>, c.name).toEqual(c.expect);
    }
  });
});

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
        firstFailedStep(denial.body, { status: 410, nonce: denialNonce, ...expected }, trust),
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
