/**
 * License certificates: JWS compact (RFC 7515), alg EdDSA (RFC 8037), typ service-license+jwt,
 * signed by a product signing key from the trust bundle (kid = key_id).
 */
import { b64uDecode, utf8, utf8Decode } from "./encoding.ts";
import { type SdkErrorCode, verificationError } from "./errors.ts";
import { verifySignature } from "./keys.ts";
import { isInt, isNonNegativeInt, isRecord, isString, type Json } from "./util.ts";
import { findSigningKey, type TrustBundle } from "./verify.ts";

export const CERTIFICATE_TYP = "service-license+jwt";

export interface LicenseClaim {
  status: string;
  type: string;
  /** Unix seconds, or null for a license without expiry. */
  expires_at: number | null;
  entitlements: Record<string, unknown>;
  policy_id: string;
  max_concurrent: number | null;
}

export interface HeartbeatClaim {
  required: boolean;
  interval_sec: number;
  /** Network grace after `exp` when the policy fails open; 0 when it fails closed. */
  grace_sec: number;
}

export interface CertificateClaims {
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
  license: LicenseClaim;
  heartbeat: HeartbeatClaim;
  [claim: string]: unknown;
}

export interface CertificateHeader {
  alg: "EdDSA";
  kid: string;
  typ: typeof CERTIFICATE_TYP;
  [param: string]: unknown;
}

export interface VerifiedCertificate {
  jws: string;
  header: CertificateHeader;
  claims: CertificateClaims;
  /**
   * When its signing key is `retired` in the bundle it was checked with: that key's `not_after`.
   * A retired key's certificates are valid only while `now < not_after` (protocol §4), whatever
   * their own `exp` says.
   */
  signerRetiredUntil?: number;
}

function fail(code: SdkErrorCode, message: string, details?: Record<string, unknown>): never {
  throw verificationError(code, message, details);
}

function decodeJsonPart(part: string, what: string): Json {
  let value: unknown;
  try {
    value = JSON.parse(utf8Decode(b64uDecode(part)));
  } catch {
    fail("CERTIFICATE_INVALID", `certificate ${what} is not base64url JSON`);
  }
  if (!isRecord(value)) fail("CERTIFICATE_INVALID", `certificate ${what} is not a JSON object`);
  return value;
}

function checkClaims(c: Json): CertificateClaims {
  const lic = c.license;
  const hb = c.heartbeat;
  const cnf = c.cnf;
  const ok =
    isString(c.iss) &&
    isString(c.sub) &&
    isString(c.aud) &&
    isInt(c.iat) &&
    isInt(c.nbf) &&
    isInt(c.exp) &&
    isString(c.jti) &&
    isString(c.activation_id) &&
    isRecord(cnf) &&
    isString(cnf.jkt) &&
    isString(c.machine_info_digest) &&
    isRecord(lic) &&
    isString(lic.status) &&
    isString(lic.type) &&
    (lic.expires_at === null || isInt(lic.expires_at)) &&
    isRecord(lic.entitlements) &&
    isString(lic.policy_id) &&
    (lic.max_concurrent === null || isInt(lic.max_concurrent)) &&
    isRecord(hb) &&
    typeof hb.required === "boolean" &&
    isNonNegativeInt(hb.interval_sec) &&
    isNonNegativeInt(hb.grace_sec);
  if (!ok) fail("CERTIFICATE_INVALID", "certificate claims are missing or malformed");
  return c as unknown as CertificateClaims;
}

/** Splits and parses a certificate without checking its signature. */
export function decodeCertificate(
  jws: string,
): VerifiedCertificate & { signingInput: string; signature: string } {
  if (!isString(jws)) fail("CERTIFICATE_INVALID", "certificate must be a string");
  const parts = jws.split(".");
  if (parts.length !== 3) fail("CERTIFICATE_INVALID", "certificate is not a JWS compact serialization");
  const [h, p, s] = parts as [string, string, string];
  const header = decodeJsonPart(h, "header");
  if (header.alg !== "EdDSA")
    fail("CERTIFICATE_INVALID", "certificate alg must be EdDSA", { alg: header.alg });
  if (header.typ !== CERTIFICATE_TYP)
    fail("CERTIFICATE_INVALID", "certificate typ is wrong", { typ: header.typ });
  if (!isString(header.kid)) fail("CERTIFICATE_INVALID", "certificate kid is missing");
  if ("crit" in header) fail("CERTIFICATE_INVALID", "certificate has critical header parameters");
  const claims = checkClaims(decodeJsonPart(p, "payload"));
  return { jws, header: header as CertificateHeader, claims, signingInput: `${h}.${p}`, signature: s };
}

export interface VerifyCertificateOptions {
  bundle: TrustBundle;
  productId: string;
  /** Thumbprint of this device's signing public key string. */
  deviceThumbprint: string;
  /** The activation the certificate must name. */
  activationId: string;
  /** The license the certificate must name (`sub`), when already known. */
  licenseId?: string;
  /** When set: refuse a certificate whose nbf is after this time (unix seconds) + leeway. */
  notBeforeCheckAt?: number;
  nbfLeewaySec?: number;
}

/**
 * Checks, in order: format and header (CERTIFICATE_INVALID), kid in the bundle (KEY_UNKNOWN) and
 * not compromised (KEY_COMPROMISED), signature (CERTIFICATE_SIGNATURE_INVALID), aud, sub and
 * activation_id (CERTIFICATE_MISMATCH), cnf.jkt (CERTIFICATE_DEVICE_MISMATCH), nbf
 * (CERTIFICATE_NOT_YET_VALID). Expiry is not an error here; licenseState() interprets it.
 */
export function verifyCertificate(jws: string, opts: VerifyCertificateOptions): VerifiedCertificate {
  const decoded = decodeCertificate(jws);
  const key = findSigningKey(opts.bundle, decoded.header.kid);
  if (!key.public_key.startsWith("ed25519:")) fail("CERTIFICATE_INVALID", "certificate key is not Ed25519");
  if (!verifySignature(key.public_key, utf8(decoded.signingInput), decoded.signature)) {
    fail("CERTIFICATE_SIGNATURE_INVALID", "certificate signature does not verify", { kid: key.key_id });
  }
  const c = decoded.claims;
  if (c.aud !== opts.productId)
    fail("CERTIFICATE_MISMATCH", "certificate is for another product", { aud: c.aud });
  if (opts.licenseId !== undefined && c.sub !== opts.licenseId) {
    fail("CERTIFICATE_MISMATCH", "certificate is for another license", { sub: c.sub });
  }
  if (c.activation_id !== opts.activationId) {
    fail("CERTIFICATE_MISMATCH", "certificate is for another activation", { activation_id: c.activation_id });
  }
  if (c.cnf.jkt !== opts.deviceThumbprint) {
    fail("CERTIFICATE_DEVICE_MISMATCH", "certificate is bound to another device key");
  }
  if (opts.notBeforeCheckAt !== undefined && c.nbf > opts.notBeforeCheckAt + (opts.nbfLeewaySec ?? 0)) {
    fail("CERTIFICATE_NOT_YET_VALID", "certificate is not valid yet", { nbf: c.nbf });
  }
  return {
    jws,
    header: decoded.header,
    claims: c,
    ...(key.status === "retired" && key.not_after !== null ? { signerRetiredUntil: key.not_after } : {}),
  };
}
