import { createPublicKey, type KeyObject } from "node:crypto";
import { readFileSync } from "node:fs";
import { sha256Hex } from "../../src/crypto/encoding.ts";
import { type Delegation, type EnvelopeSignature, PREFIX } from "../../src/crypto/envelope.ts";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { keyIdOf, parsePublicKey, publicKeyText, verifySignature } from "../../src/crypto/keys.ts";
import type { ActivationCreateBody, HeartbeatBody } from "../../src/modules/activations/model.ts";
import type { TrustBundleBody } from "../../src/modules/trust/service.ts";
import { readVectors } from "./vectors.ts";

/**
 * The vectors of docs/protocol.md as the protocol-vectors-{signing,activation,server} tests read
 * them: the document, each vector's shape, and the documented client's checks of a signed response.
 */

const DOC_PATH = new URL("../../docs/protocol.md", import.meta.url);
export const DOC = readFileSync(DOC_PATH, "utf8");

/**
 * Every vector the document must carry; a missing or extra block fails the first test of
 * test/unit/protocol-vectors-signing.test.ts.
 */
export const EXPECTED_VECTORS = [
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
export type VectorName = (typeof EXPECTED_VECTORS)[number];

export const vectors = readVectors(DOC);

export function vector<T>(name: VectorName): T {
  const found = vectors.get(name);
  if (!found) throw new Error(`docs/protocol.md has no vector "${name}"`);
  return found as T;
}

export interface KeysVector {
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
export interface JcsVector {
  input: unknown;
  canonical: string;
  canonical_sha256: string;
  numbers: [string, string][];
}
export interface TrustBundleVector {
  root_seed_hex: string;
  root_public_key: string;
  data: { bundle: TrustBundleBody; root_signature: string };
  signing_string: string;
}
export interface DelegationVector {
  parent_seed_hex: string;
  online_seed_hex: string;
  delegation: Delegation;
  signing_string: string;
  signature: string;
}
export interface ResponseVector {
  online_seed_hex: string;
  body_canonical: string;
  signing_string: string;
  envelope: EnvelopeSignature & { data?: unknown; error?: Record<string, unknown> };
}
export interface ActivationVector {
  device_seed_hex: string;
  idempotency_key: string;
  body: ActivationCreateBody;
  signing_string: string;
  machine_info_digest: string;
  idempotency_part: Record<string, unknown>;
  idempotency_fingerprint: string;
}
export interface DeviceProofVector {
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
export interface IssuedFrom {
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
export interface CertificateVector {
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
export interface CertificateRulesVector {
  defaults: string;
  cases: {
    name: string;
    now: number;
    license: Partial<IssuedFrom["license"]>;
    policy: Record<string, unknown>;
    expect: Record<string, unknown>;
  }[];
}
export interface MachineInfoRulesVector {
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

export const utf8 = (text: string) => new TextEncoder().encode(text);
export const publicOf = (key: KeyObject) => publicKeyText(createPublicKey(key));
export const parsed = (text: string) => {
  const info = parsePublicKey(text);
  if (!info) throw new Error(`not a contract key string: ${text}`);
  return info;
};

/** What the documented client does (docs/protocol.md §6), step by step; the first failed step. */
export function firstFailedStep(
  body: ResponseVector["envelope"],
  expected: {
    status: number;
    nonce: string;
    productId: string;
    /** Whom a denial must name in its signed details (§6, §16): `{ activation_id }` or `{ device_thumbprint }`. */
    subject?: Record<string, string>;
  },
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
  if ("error" in body) {
    const details = (body.error?.details ?? {}) as Record<string, unknown>;
    for (const [field, value] of Object.entries(expected.subject ?? {}))
      if (details[field] !== value) return "denial subject";
  }
  return null;
}
