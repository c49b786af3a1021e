/**
 * Verification of trust bundles and signed runtime envelopes (DESIGN §5). Pure functions: they
 * take the parsed JSON and the trusted inputs, and either return the verified content or throw
 * an SdkError of kind "verification".
 */
import type { ResolvedConfig } from "./config.ts";
import { sha256Hex, utf8 } from "./encoding.ts";
import { type SdkErrorCode, verificationError } from "./errors.ts";
import { canonicalize } from "./jcs.ts";
import { keyIdOf, parsePublicKey, verifySignature } from "./keys.ts";
import { PREFIX } from "./proof.ts";
import { HEX64, isInt, isNonEmptyString, isNonNegativeInt, isRecord, isString, type Json } from "./util.ts";

export type KeyStatus = "active" | "retired" | "compromised";

export interface BundleKey {
  key_id: string;
  public_key: string;
  status: KeyStatus;
  not_before: number;
  not_after: number | null;
}

export interface TrustBundle {
  v: 1;
  product_id: string;
  environment: string;
  sequence: number;
  issued_at: number;
  root_key_id: string;
  signing_keys: BundleKey[];
}

/** `data` of the trust-bundle response. */
export interface SignedTrustBundle {
  bundle: TrustBundle;
  root_signature: string;
}

export interface Delegation {
  v: 1;
  purpose: "runtime-response";
  product_id: string;
  parent_key_id: string;
  online_key_id: string;
  public_key: string;
  issued_at: number;
  expires_at: number;
}

export interface ResponseAssertion {
  v: 1;
  product_id: string;
  key_id: string;
  parent_key_id: string;
  request_id: string;
  nonce: string;
  server_time: number;
  status: number;
  body_sha256: string;
}

export const MAX_DELEGATION_SEC = 7 * 24 * 60 * 60;
const KEY_STATUSES: readonly string[] = ["active", "retired", "compromised"];

function fail(code: SdkErrorCode, message: string, details?: Record<string, unknown>): never {
  throw verificationError(code, message, details);
}

function checkBundleKey(value: unknown, index: number): BundleKey {
  const where = { index };
  if (!isRecord(value)) fail("BUNDLE_INVALID", "signing key entry is not an object", where);
  const { key_id, public_key, status, not_before, not_after } = value;
  if (!isNonEmptyString(key_id) || !isString(public_key))
    fail("BUNDLE_INVALID", "bad signing key entry", where);
  try {
    parsePublicKey(public_key);
  } catch {
    fail("BUNDLE_INVALID", "signing key public_key is malformed", { ...where, key_id });
  }
  if (keyIdOf(public_key) !== key_id) fail("BUNDLE_INVALID", "key_id does not match public_key", { key_id });
  if (!isString(status) || !KEY_STATUSES.includes(status))
    fail("BUNDLE_INVALID", "bad key status", { key_id });
  if (!isInt(not_before) || !(not_after === null || isInt(not_after))) {
    fail("BUNDLE_INVALID", "bad key validity window", { key_id });
  }
  return { key_id, public_key, status: status as KeyStatus, not_before, not_after };
}

export interface VerifyBundleOptions {
  config: ResolvedConfig;
  /** The highest sequence this device has accepted before (0 when none). */
  highestSequence: number;
}

/**
 * Verifies `{ bundle, root_signature }`. Order of checks (and codes): shape (BUNDLE_INVALID),
 * root_key_id == trust_anchor.key_id (BUNDLE_ROOT_MISMATCH), root signature over
 * "Service-Trust-Bundle-v1\n" + JCS(bundle) (BUNDLE_SIGNATURE_INVALID), contents
 * (BUNDLE_INVALID), product (PRODUCT_MISMATCH), environment (BUNDLE_ENVIRONMENT_MISMATCH),
 * sequence >= minimum_trust_bundle_sequence and >= highest held (BUNDLE_SEQUENCE_ROLLBACK).
 */
export function verifyTrustBundle(input: unknown, opts: VerifyBundleOptions): SignedTrustBundle {
  if (!isRecord(input) || !isRecord(input.bundle) || !isString(input.root_signature)) {
    fail("BUNDLE_INVALID", "trust bundle must be { bundle, root_signature }");
  }
  const b = input.bundle;
  if (b.root_key_id !== opts.config.rootKeyId) {
    fail("BUNDLE_ROOT_MISMATCH", "bundle names another root key", {
      root_key_id: b.root_key_id,
      expected: opts.config.rootKeyId,
    });
  }
  let message: Uint8Array;
  try {
    message = utf8(PREFIX.trustBundle + canonicalize(b));
  } catch {
    fail("BUNDLE_INVALID", "bundle cannot be canonicalized");
  }
  if (!verifySignature(opts.config.rootPublicKey, message, input.root_signature)) {
    fail("BUNDLE_SIGNATURE_INVALID", "trust bundle root signature does not verify");
  }
  if (b.v !== 1) fail("BUNDLE_INVALID", "unsupported bundle version", { v: b.v });
  if (!isString(b.product_id) || !isString(b.environment))
    fail("BUNDLE_INVALID", "bad product or environment");
  if (!isNonNegativeInt(b.sequence) || !isInt(b.issued_at))
    fail("BUNDLE_INVALID", "bad sequence or issued_at");
  if (!Array.isArray(b.signing_keys)) fail("BUNDLE_INVALID", "signing_keys must be an array");
  const keys = b.signing_keys.map(checkBundleKey);
  if (new Set(keys.map((k) => k.key_id)).size !== keys.length) fail("BUNDLE_INVALID", "duplicate key_id");
  if (b.product_id !== opts.config.productId) {
    fail("PRODUCT_MISMATCH", "bundle is for another product", { product_id: b.product_id });
  }
  if (b.environment !== opts.config.environment) {
    fail("BUNDLE_ENVIRONMENT_MISMATCH", "bundle is for another environment", { environment: b.environment });
  }
  const floor = Math.max(opts.config.minimumBundleSequence, opts.highestSequence);
  if (b.sequence < floor) {
    const below =
      opts.highestSequence >= opts.config.minimumBundleSequence
        ? "older than one already trusted"
        : "below the config's minimum_trust_bundle_sequence";
    fail("BUNDLE_SEQUENCE_ROLLBACK", `bundle is ${below}`, {
      sequence: b.sequence,
      minimum: floor,
    });
  }
  const bundle: TrustBundle = {
    v: 1,
    product_id: b.product_id,
    environment: b.environment,
    sequence: b.sequence,
    issued_at: b.issued_at,
    root_key_id: b.root_key_id as string,
    signing_keys: keys,
  };
  return { bundle, root_signature: input.root_signature };
}

/** The non-compromised bundle key named `keyId`; throws KEY_UNKNOWN or KEY_COMPROMISED. */
export function findSigningKey(bundle: TrustBundle, keyId: string): BundleKey {
  const key = bundle.signing_keys.find((k) => k.key_id === keyId);
  if (!key) fail("KEY_UNKNOWN", "the signing key is not in the trust bundle", { key_id: keyId });
  if (key.status === "compromised")
    fail("KEY_COMPROMISED", "the signing key is compromised", { key_id: keyId });
  return key;
}

/** True when the body carries any of the three signature fields. */
export function hasSignatureFields(body: unknown): boolean {
  return (
    isRecord(body) &&
    (body.response_assertion !== undefined ||
      body.response_signature !== undefined ||
      body.signing_delegation !== undefined)
  );
}

export interface VerifyEnvelopeOptions {
  bundle: TrustBundle;
  productId: string;
  /** The nonce this request sent (body `nonce`, else `X-Service-Nonce`). */
  nonce: string;
  /** The HTTP status received. */
  status: number;
  /** "data" for 2xx responses, "error" for the signed license-state denials. */
  payloadField: "data" | "error";
}

export interface VerifiedEnvelope {
  payload: unknown;
  assertion: ResponseAssertion;
  delegation: Delegation;
}

function checkDelegationShape(d: Json): Delegation {
  const ok =
    isString(d.purpose) &&
    isString(d.product_id) &&
    isNonEmptyString(d.online_key_id) &&
    isString(d.public_key) &&
    isInt(d.expires_at);
  if (!ok) fail("DELEGATION_INVALID", "delegation fields are missing or malformed");
  return d as unknown as Delegation;
}

function checkAssertionShape(a: unknown): ResponseAssertion {
  if (!isRecord(a)) fail("ASSERTION_INVALID", "response_assertion must be an object");
  if (a.v !== 1) fail("ASSERTION_INVALID", "unsupported assertion version", { v: a.v });
  const ok =
    isString(a.product_id) &&
    isString(a.key_id) &&
    isString(a.parent_key_id) &&
    isString(a.request_id) &&
    isString(a.nonce) &&
    isInt(a.server_time) &&
    isInt(a.status) &&
    isString(a.body_sha256) &&
    HEX64.test(a.body_sha256);
  if (!ok) fail("ASSERTION_INVALID", "assertion fields are missing or malformed");
  return a as unknown as ResponseAssertion;
}

/**
 * Verifies a signed envelope against a verified bundle. Order of checks (first failure wins):
 * 1. envelope shape (RESPONSE_UNSIGNED when no signature field at all, RESPONSE_INVALID,
 *    DELEGATION_INVALID);
 * 2. parent key: in the bundle (KEY_UNKNOWN), not compromised (KEY_COMPROMISED),
 *    not_before <= delegation.issued_at <= not_after (KEY_NOT_VALID), Ed25519 (DELEGATION_INVALID);
 * 3. delegation signature (DELEGATION_SIGNATURE_INVALID);
 * 4. delegation v == 1, purpose, product (PRODUCT_MISMATCH), public_key Ed25519,
 *    online_key_id == key id of public_key, 0 <= expires_at - issued_at <= 7 days
 *    (DELEGATION_INVALID);
 * 5. assertion shape and v == 1 (ASSERTION_INVALID); key_id == online_key_id and
 *    parent_key_id == delegation.parent_key_id (ONLINE_KEY_MISMATCH);
 * 6. response signature with the delegated key (RESPONSE_SIGNATURE_INVALID);
 * 7. issued_at <= server_time <= expires_at (DELEGATION_EXPIRED);
 * 8. nonce (NONCE_MISMATCH), status (STATUS_MISMATCH), product (PRODUCT_MISMATCH), body hash
 *    over JCS(payload) (BODY_HASH_MISMATCH).
 */
export function verifyEnvelope(body: unknown, opts: VerifyEnvelopeOptions): VerifiedEnvelope {
  if (!hasSignatureFields(body)) fail("RESPONSE_UNSIGNED", "the response is not signed");
  const env = body as Json;
  if (!(opts.payloadField in env) || env[opts.payloadField] === undefined) {
    fail("RESPONSE_INVALID", `signed response has no ${opts.payloadField}`);
  }
  const sd = env.signing_delegation;
  if (!isRecord(sd) || !isRecord(sd.delegation) || !isString(sd.signature)) {
    fail("DELEGATION_INVALID", "signing_delegation must be { delegation, signature }");
  }
  const d = sd.delegation;
  if (!isString(d.parent_key_id) || !isInt(d.issued_at)) {
    fail("DELEGATION_INVALID", "delegation parent_key_id or issued_at missing");
  }

  // 2. parent key
  const parent = findSigningKey(opts.bundle, d.parent_key_id);
  if (parent.not_before > d.issued_at || (parent.not_after !== null && parent.not_after < d.issued_at)) {
    fail("KEY_NOT_VALID", "delegation issued outside the parent key's validity", { key_id: parent.key_id });
  }
  if (!parent.public_key.startsWith("ed25519:")) fail("DELEGATION_INVALID", "parent key is not Ed25519");

  // 3. delegation signature
  let delegationMessage: Uint8Array;
  try {
    delegationMessage = utf8(PREFIX.delegation + canonicalize(d));
  } catch {
    fail("DELEGATION_INVALID", "delegation cannot be canonicalized");
  }
  if (!verifySignature(parent.public_key, delegationMessage, sd.signature)) {
    fail("DELEGATION_SIGNATURE_INVALID", "delegation signature does not verify", { key_id: parent.key_id });
  }

  // 4. delegation contents
  if (d.v !== 1) fail("DELEGATION_INVALID", "unsupported delegation version", { v: d.v });
  const delegation = checkDelegationShape(d);
  if (delegation.purpose !== "runtime-response") fail("DELEGATION_INVALID", "wrong delegation purpose");
  if (delegation.product_id !== opts.productId) {
    fail("PRODUCT_MISMATCH", "delegation is for another product", { product_id: delegation.product_id });
  }
  let onlineKeyOk = false;
  try {
    onlineKeyOk = parsePublicKey(delegation.public_key).alg === "ed25519";
  } catch {
    onlineKeyOk = false;
  }
  if (!onlineKeyOk) fail("DELEGATION_INVALID", "delegated public_key is not a valid Ed25519 key");
  if (keyIdOf(delegation.public_key) !== delegation.online_key_id) {
    fail("DELEGATION_INVALID", "online_key_id does not match the delegated public_key");
  }
  const lifetime = delegation.expires_at - delegation.issued_at;
  if (lifetime < 0 || lifetime > MAX_DELEGATION_SEC) {
    fail("DELEGATION_INVALID", "delegation validity is negative or longer than 7 days", { lifetime });
  }

  // 5. assertion
  const assertion = checkAssertionShape(env.response_assertion);
  if (assertion.key_id !== delegation.online_key_id || assertion.parent_key_id !== delegation.parent_key_id) {
    fail("ONLINE_KEY_MISMATCH", "assertion keys differ from the delegation", {
      key_id: assertion.key_id,
      parent_key_id: assertion.parent_key_id,
    });
  }

  // 6. response signature
  const responseMessage = utf8(PREFIX.response + canonicalize(env.response_assertion));
  if (!verifySignature(delegation.public_key, responseMessage, env.response_signature)) {
    fail("RESPONSE_SIGNATURE_INVALID", "response signature does not verify");
  }

  // 7. delegation window at the signed server time
  if (assertion.server_time < delegation.issued_at || assertion.server_time > delegation.expires_at) {
    fail("DELEGATION_EXPIRED", "response signed outside the delegation's validity", {
      server_time: assertion.server_time,
    });
  }

  // 8. binding to this request and this body
  if (assertion.nonce !== opts.nonce) fail("NONCE_MISMATCH", "response nonce differs from the request's");
  if (assertion.status !== opts.status) {
    fail("STATUS_MISMATCH", "signed status differs from the HTTP status", {
      signed: assertion.status,
      received: opts.status,
    });
  }
  if (assertion.product_id !== opts.productId) {
    fail("PRODUCT_MISMATCH", "response is for another product", { product_id: assertion.product_id });
  }
  let bodyHash: string;
  try {
    bodyHash = sha256Hex(utf8(canonicalize(env[opts.payloadField])));
  } catch {
    fail("RESPONSE_INVALID", `${opts.payloadField} cannot be canonicalized`);
  }
  if (bodyHash !== assertion.body_sha256)
    fail("BODY_HASH_MISMATCH", "body hash differs from the signed hash");

  return { payload: env[opts.payloadField], assertion, delegation };
}
