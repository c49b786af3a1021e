/**
 * Offline packages on the device (DESIGN §5 "Offline package"): the signed request the device
 * hands to its vendor, and the end-to-end check of the ZIP that comes back, with nothing but the
 * root public key: root -> trust bundle -> manifest signature -> file hashes -> license.jwt bound
 * to this device.
 */
import { decodeCertificate, type VerifiedCertificate, verifyCertificate } from "./certificate.ts";
import type { ResolvedConfig } from "./config.ts";
import { sha256Hex, utf8, utf8Decode } from "./encoding.ts";
import { type SdkErrorCode, verificationError } from "./errors.ts";
import { canonicalize } from "./jcs.ts";
import { type DeviceKeys, sign, thumbprint, verifySignature } from "./keys.ts";
import { PREFIX } from "./proof.ts";
import type { MachineInfo } from "./state.ts";
import { HEX64, isInt, isRecord, isString, type Json } from "./util.ts";
import { type SignedTrustBundle, type TrustBundle, verifyTrustBundle } from "./verify.ts";
import { readStoredZip, ZipFormatError } from "./zip.ts";

export const OFFLINE_REQUEST_FORMAT = "service-offline-request-v1";
export const OFFLINE_PACKAGE_FORMAT = "service-offline-package-v1";
export const PACKAGE_ENTRIES = ["manifest.json", "manifest.sig", "license.jwt", "trust-bundle.json"] as const;
const HASHED = ["license.jwt", "trust-bundle.json"] as const;

export interface OfflineRequest {
  format: typeof OFFLINE_REQUEST_FORMAT;
  product_id: string;
  device_signing_public_key: string;
  device_kem_public_key: string;
  machine_info: MachineInfo;
  nonce: string;
  generated_at: number;
  device_proof: string;
}

export interface OfflineManifest {
  format: typeof OFFLINE_PACKAGE_FORMAT;
  product_id: string;
  license_id: string;
  assignment_id: string | null;
  device_signing_key_thumbprint: string;
  device_kem_key_thumbprint: string;
  issued_at: number;
  expires_at: number;
  files: Record<string, string>;
}

export interface VerifiedOfflinePackage {
  manifest: OfflineManifest;
  certificate: VerifiedCertificate;
  /** The signed bundle the package carries, verified against the root key. */
  signedBundle: SignedTrustBundle;
  /** The bundle the checks used: the package's, or a newer one the device already trusted. */
  bundle: TrustBundle;
}

/**
 * The request a device sends (through its vendor) for an offline package: signed with the
 * device signing key after the prefix "Service-Offline-Request-v1\n" over JCS(request without
 * device_proof). `nonce` makes every request unique; `generated_at` is local Unix seconds.
 */
export function createOfflineRequest(
  keys: DeviceKeys,
  input: { productId: string; machineInfo: MachineInfo; generatedAt: number; nonce: string },
): OfflineRequest {
  const unsigned = {
    format: OFFLINE_REQUEST_FORMAT,
    product_id: input.productId,
    device_signing_public_key: keys.signing.publicKey,
    device_kem_public_key: keys.kem.publicKey,
    machine_info: input.machineInfo,
    nonce: input.nonce,
    generated_at: input.generatedAt,
  } as const;
  const device_proof = sign(keys.signing, utf8(PREFIX.offlineRequest + canonicalize(unsigned)));
  return { ...unsigned, device_proof };
}

function fail(code: SdkErrorCode, message: string, details?: Record<string, unknown>): never {
  throw verificationError(code, message, details);
}

function json(bytes: Uint8Array, what: string): Json {
  let value: unknown;
  try {
    value = JSON.parse(utf8Decode(bytes));
  } catch {
    fail("PACKAGE_INVALID", `${what} is not UTF-8 JSON`);
  }
  if (!isRecord(value)) fail("PACKAGE_INVALID", `${what} is not a JSON object`);
  return value;
}

/** The members of a service-offline-package-v1 manifest, exactly (protocol §18 step 3). */
const MANIFEST_MEMBERS = [
  "assignment_id",
  "device_kem_key_thumbprint",
  "device_signing_key_thumbprint",
  "expires_at",
  "files",
  "format",
  "issued_at",
  "license_id",
  "product_id",
] as const;

function checkManifest(m: Json): OfflineManifest {
  const files = m.files;
  const members = Object.keys(m);
  const ok =
    members.length === MANIFEST_MEMBERS.length &&
    MANIFEST_MEMBERS.every((name) => Object.hasOwn(m, name)) &&
    m.format === OFFLINE_PACKAGE_FORMAT &&
    isString(m.product_id) &&
    isString(m.license_id) &&
    (m.assignment_id === null || isString(m.assignment_id)) &&
    isString(m.device_signing_key_thumbprint) &&
    HEX64.test(m.device_signing_key_thumbprint) &&
    isString(m.device_kem_key_thumbprint) &&
    HEX64.test(m.device_kem_key_thumbprint) &&
    isInt(m.issued_at) &&
    isInt(m.expires_at) &&
    m.expires_at > m.issued_at &&
    isRecord(files) &&
    Object.keys(files).length === HASHED.length &&
    HASHED.every((name) => isString(files[name]) && HEX64.test(files[name]));
  if (!ok) fail("PACKAGE_INVALID", "manifest.json lacks fields of service-offline-package-v1 or has others");
  return m as unknown as OfflineManifest;
}

export interface VerifyOfflinePackageOptions {
  /** The app's integration config: root key, product, environment, minimum bundle sequence. */
  config: ResolvedConfig;
  /** The public keys of this device. */
  device: { signingPublicKey: string; kemPublicKey: string };
  /** A newer bundle the device already verified; used when the package's is older. */
  trustedBundle?: TrustBundle;
  /**
   * The highest bundle sequence this device has accepted (its stored floor; 0 when none). Without
   * a trusted bundle at least that new, the package's own bundle must reach it: a device that
   * learned of a compromised key must not take an older bundle that still trusts it, even when
   * the bundle it stored is gone.
   */
  highestSequence?: number;
}

/** Checks an offline package end to end; throws SdkError (kind "verification") at the first failure. */
export function verifyOfflinePackage(
  zip: Uint8Array,
  opts: VerifyOfflinePackageOptions,
): VerifiedOfflinePackage {
  let entries: Map<string, Uint8Array>;
  try {
    entries = readStoredZip(zip, PACKAGE_ENTRIES);
  } catch (error) {
    if (error instanceof ZipFormatError)
      fail("PACKAGE_INVALID", `not an offline package ZIP: ${error.message}`);
    throw error;
  }
  const entry = (name: (typeof PACKAGE_ENTRIES)[number]) => entries.get(name) as Uint8Array;

  // 1. root -> bundle. A package keeps the bundle of its issue, which a later config may call too
  // old; a newer bundle the device already trusts (itself at or above the config's minimum and
  // the device's floor) then stands in for it, so the package's own bundle need only be genuine.
  // Without one, the package's bundle must meet the minimum and the floor itself.
  const floor = opts.highestSequence ?? 0;
  const trusted =
    opts.trustedBundle &&
    opts.trustedBundle.sequence >= opts.config.minimumBundleSequence &&
    opts.trustedBundle.sequence >= floor
      ? opts.trustedBundle
      : undefined;
  const signedBundle = verifyTrustBundle(json(entry("trust-bundle.json"), "trust-bundle.json"), {
    config: trusted ? { ...opts.config, minimumBundleSequence: 0 } : opts.config,
    highestSequence: trusted ? 0 : floor,
  });
  const bundle = trusted && trusted.sequence > signedBundle.bundle.sequence ? trusted : signedBundle.bundle;

  // 2. manifest signature, by a listed, uncompromised product signing key valid when it was issued.
  const manifestValue = json(entry("manifest.json"), "manifest.json");
  let signature: string;
  try {
    signature = utf8Decode(entry("manifest.sig"));
  } catch {
    fail("PACKAGE_INVALID", "manifest.sig is not text");
  }
  let manifestJcs: string;
  try {
    manifestJcs = canonicalize(manifestValue);
  } catch {
    fail("PACKAGE_INVALID", "manifest.json cannot be canonicalized");
  }
  // Its bytes are JCS and nothing else: no hash covers them, and a package must have one byte form
  // (spaces or a repeated member would parse to the same signed value).
  if (manifestJcs !== utf8Decode(entry("manifest.json")))
    fail("PACKAGE_INVALID", "manifest.json is not the JCS form of its value");
  const message = utf8(PREFIX.offlinePackage + manifestJcs);
  const issuedAt = manifestValue.issued_at;
  const signer = bundle.signing_keys.find(
    (key) =>
      key.status !== "compromised" &&
      key.public_key.startsWith("ed25519:") &&
      isInt(issuedAt) &&
      key.not_before <= issuedAt &&
      (key.not_after === null || issuedAt <= key.not_after) &&
      verifySignature(key.public_key, message, signature),
  );
  if (!signer)
    fail("PACKAGE_SIGNATURE_INVALID", "manifest.sig does not verify with a valid key of the trust bundle");
  const manifest = checkManifest(manifestValue);
  if (manifest.product_id !== opts.config.productId)
    fail("PRODUCT_MISMATCH", "the package is for another product", { product_id: manifest.product_id });

  // 3. file hashes.
  for (const name of HASHED) {
    if (sha256Hex(entry(name)) !== manifest.files[name])
      fail("PACKAGE_HASH_MISMATCH", `${name} differs from the hash the manifest signs`, { entry: name });
  }

  // 4. bound to this device: both key thumbprints, then the certificate itself.
  const signingThumbprint = thumbprint(opts.device.signingPublicKey);
  if (
    manifest.device_signing_key_thumbprint !== signingThumbprint ||
    manifest.device_kem_key_thumbprint !== thumbprint(opts.device.kemPublicKey)
  )
    fail("PACKAGE_DEVICE_MISMATCH", "the package was issued to another device");
  let jws: string;
  try {
    jws = utf8Decode(entry("license.jwt"));
  } catch {
    fail("PACKAGE_INVALID", "license.jwt is not text");
  }
  const activationId = decodeCertificate(jws).claims.activation_id;
  const certificate = verifyCertificate(jws, {
    bundle,
    productId: opts.config.productId,
    deviceThumbprint: signingThumbprint,
    activationId,
    licenseId: manifest.license_id,
  });
  if (certificate.claims.exp !== manifest.expires_at)
    fail("CERTIFICATE_MISMATCH", "license.jwt expires at another time than the package");
  return { manifest, certificate, signedBundle, bundle };
}
