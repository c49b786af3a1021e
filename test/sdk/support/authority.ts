/**
 * Test-only signing authority: a root key, product signing keys and an online key, built with
 * @noble directly, producing trust bundles, delegations, signed envelopes and certificates the
 * way DESIGN §5 describes them. Options let a test sign wrong content honestly (pre-sign
 * overrides) or tamper after signing (post-sign mutations).
 */
import { ed25519 } from "@noble/curves/ed25519.js";
import { b64uEncode, canonicalize, keyIdOf, sha256Hex } from "../../../src/sdk/index.ts";

const enc = new TextEncoder();
export const utf8 = (s: string): Uint8Array => enc.encode(s);

export interface EdKey {
  secret: Uint8Array;
  publicKey: string;
  keyId: string;
}

export function edKey(seedByte?: number): EdKey {
  const secret = seedByte === undefined ? ed25519.utils.randomSecretKey() : new Uint8Array(32).fill(seedByte);
  const publicKey = `ed25519:${b64uEncode(ed25519.getPublicKey(secret))}`;
  return { secret, publicKey, keyId: keyIdOf(publicKey) };
}

export function edSign(key: EdKey, message: string): string {
  return b64uEncode(ed25519.sign(utf8(message), key.secret));
}

export type Json = Record<string, unknown>;

export interface SigningKeyEntry extends EdKey {
  status: "active" | "retired" | "compromised";
  not_before: number;
  not_after: number | null;
}

export const T0 = 1_800_000_000; // 2027-01-15T08:00:00Z

export class Authority {
  productId = "prod_01JTESTPRODUCT0000000000000";
  environment: "live" | "test" = "live";
  apiUrl = "https://licensing.example.test";
  root = edKey();
  devRoot = edKey();
  signing: SigningKeyEntry[] = [{ ...edKey(), status: "active", not_before: T0 - 86_400, not_after: null }];
  online = edKey();
  sequence = 3;
  delegationIssuedAt = T0 - 3600;
  delegationLifetime = 86_400;
  requestCounter = 0;

  get parent(): SigningKeyEntry {
    return this.signing[0]!;
  }

  config(overrides: Json = {}): Json {
    return {
      service_config_version: 1,
      generated_at: "2027-01-01T00:00:00Z",
      bundle_version: "1",
      environment: this.environment,
      api_url: this.apiUrl,
      product: { id: this.productId, name: "Test Product" },
      trust_anchor: {
        signing_mode: "delegated",
        key_id: this.environment === "live" ? this.root.keyId : this.devRoot.keyId,
        trust_bundle_url: `${this.apiUrl}/runtime/v1/products/${this.productId}/trust-bundle`,
        minimum_trust_bundle_sequence: 1,
        root_public_key: this.root.publicKey,
        development_root_public_key: this.devRoot.publicKey,
        public_key_unavailable_reason: null,
        signing_keys_pending_reason: null,
      },
      entitlements: [{ name: "pro", type: "boolean", policies: ["pol_1"] }],
      license_key_delivery: "manual",
      billing_license_claim_url: null,
      ...overrides,
    };
  }

  bundle(overrides: Json = {}): Json {
    const rootKey = this.environment === "live" ? this.root : this.devRoot;
    return {
      v: 1,
      product_id: this.productId,
      environment: this.environment,
      sequence: this.sequence,
      issued_at: T0 - 7200,
      root_key_id: rootKey.keyId,
      signing_keys: this.signing.map((k) => ({
        key_id: k.keyId,
        public_key: k.publicKey,
        status: k.status,
        not_before: k.not_before,
        not_after: k.not_after,
      })),
      ...overrides,
    };
  }

  signedBundle(opts: { overrides?: Json; signer?: EdKey } = {}): Json {
    const bundle = this.bundle(opts.overrides);
    const signer = opts.signer ?? (this.environment === "live" ? this.root : this.devRoot);
    return { bundle, root_signature: edSign(signer, `Service-Trust-Bundle-v1\n${canonicalize(bundle)}`) };
  }

  delegation(overrides: Json = {}): Json {
    return {
      v: 1,
      purpose: "runtime-response",
      product_id: this.productId,
      parent_key_id: this.parent.keyId,
      online_key_id: this.online.keyId,
      public_key: this.online.publicKey,
      issued_at: this.delegationIssuedAt,
      expires_at: this.delegationIssuedAt + this.delegationLifetime,
      ...overrides,
    };
  }

  /**
   * A signed envelope. `assertion` / `delegation` override fields before signing; `delegationSigner`
   * and `responseSigner` sign with other keys.
   */
  envelope(
    payload: unknown,
    opts: {
      nonce: string;
      status: number;
      serverTime?: number;
      field?: "data" | "error";
      assertion?: Json;
      delegation?: Json;
      delegationSigner?: EdKey;
      responseSigner?: EdKey;
    },
  ): Json {
    const delegation = this.delegation(opts.delegation);
    const assertion = {
      v: 1,
      product_id: this.productId,
      key_id: this.online.keyId,
      parent_key_id: this.parent.keyId,
      request_id: `req_${++this.requestCounter}`,
      nonce: opts.nonce,
      server_time: opts.serverTime ?? T0,
      status: opts.status,
      body_sha256: sha256Hex(utf8(canonicalize(payload))),
      ...opts.assertion,
    };
    return {
      [opts.field ?? "data"]: payload,
      response_assertion: assertion,
      response_signature: edSign(
        opts.responseSigner ?? this.online,
        `Service-Response-v1\n${canonicalize(assertion)}`,
      ),
      signing_delegation: {
        delegation,
        signature: edSign(
          opts.delegationSigner ?? this.parent,
          `Service-Delegation-v1\n${canonicalize(delegation)}`,
        ),
      },
    };
  }

  /** A license certificate (JWS compact) for a device thumbprint. */
  certificate(opts: {
    jkt: string;
    activationId: string;
    claims?: Json;
    header?: Json;
    signer?: SigningKeyEntry;
  }): string {
    const signer = opts.signer ?? this.parent;
    const header = { alg: "EdDSA", kid: signer.keyId, typ: "service-license+jwt", ...opts.header };
    const claims = {
      iss: this.apiUrl,
      sub: "lic_01JTESTLICENSE00000000000000",
      aud: this.productId,
      iat: T0,
      nbf: T0,
      exp: T0 + 86_400,
      jti: `crt_${++this.requestCounter}`,
      activation_id: opts.activationId,
      cnf: { jkt: opts.jkt },
      machine_info_digest: "0".repeat(64),
      license: {
        status: "active",
        type: "subscription",
        expires_at: T0 + 365 * 86_400,
        entitlements: { pro: true, seats: 5 },
        policy_id: "pol_01JTESTPOLICY000000000000000",
        max_concurrent: 2,
      },
      heartbeat: { required: true, interval_sec: 3600, grace_sec: 7200 },
      ...opts.claims,
    };
    const input = `${b64uEncode(utf8(JSON.stringify(header)))}.${b64uEncode(utf8(JSON.stringify(claims)))}`;
    return `${input}.${edSign(signer, input)}`;
  }
}
