import type { KeyObject } from "node:crypto";
import { unzipSync, zipSync } from "fflate";
import { sha256Hex } from "./encoding.ts";
import { PREFIX } from "./envelope.ts";
import { canonicalize } from "./jcs.ts";
import { signEd25519 } from "./keys.ts";

/**
 * The offline package of DESIGN §5 (contract), `application/vnd.service.offline+zip`: a ZIP of
 * `manifest.json`, `manifest.sig`, `license.jwt` and `trust-bundle.json`, stored (not deflated),
 * in that order, with one fixed timestamp, so a reader needs no inflater and the bytes depend
 * only on what is signed.
 */
export const OFFLINE_PACKAGE_MEDIA_TYPE = "application/vnd.service.offline+zip";
export const OFFLINE_PACKAGE_FORMAT = "service-offline-package-v1";
export const OFFLINE_REQUEST_FORMAT = "service-offline-request-v1";
export const PACKAGE_ENTRIES = ["manifest.json", "manifest.sig", "license.jwt", "trust-bundle.json"] as const;

/**
 * 1980-01-01 00:00:00, the first instant a ZIP (DOS) timestamp can hold. Built from local-time
 * fields because the ZIP writer stores local-time fields: the stored value is the same in every
 * time zone.
 */
const ZIP_TIMESTAMP = new Date(1980, 0, 1, 0, 0, 0);

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

export interface PackageContents {
  manifest: Omit<OfflineManifest, "format" | "files">;
  licenseJwt: string;
  /** The signed trust bundle, `{ bundle, root_signature }`, as the trust-bundle route serves it. */
  trustBundle: unknown;
}

/** Signs the manifest and writes the ZIP. Files are hashed as stored; manifest.json is JCS(manifest). */
export function buildOfflinePackage(
  contents: PackageContents,
  signingKey: KeyObject,
): { bytes: Uint8Array; manifest: OfflineManifest; signature: string } {
  const encoder = new TextEncoder();
  const licenseJwt = encoder.encode(contents.licenseJwt);
  const trustBundle = encoder.encode(canonicalize(contents.trustBundle));
  const manifest: OfflineManifest = {
    format: OFFLINE_PACKAGE_FORMAT,
    ...contents.manifest,
    files: { "license.jwt": sha256Hex(licenseJwt), "trust-bundle.json": sha256Hex(trustBundle) },
  };
  const manifestText = canonicalize(manifest);
  const signature = signEd25519(signingKey, PREFIX.offlinePackage + manifestText);
  const entry = (data: Uint8Array) =>
    [data, { level: 0, mtime: ZIP_TIMESTAMP }] as [Uint8Array, { level: 0; mtime: Date }];
  // Object key order is the entry order in the archive.
  const bytes = zipSync({
    "manifest.json": entry(encoder.encode(manifestText)),
    "manifest.sig": entry(encoder.encode(signature)),
    "license.jwt": entry(licenseJwt),
    "trust-bundle.json": entry(trustBundle),
  });
  return { bytes, manifest, signature };
}

/** The certificate (license.jwt) of a package this service built and stored; not for packages from outside. */
export function storedPackageLicenseJwt(bytes: Uint8Array): string {
  const entry = unzipSync(bytes, { filter: (file) => file.name === "license.jwt" })["license.jwt"];
  if (!entry) throw new Error("a stored offline package has no license.jwt");
  return new TextDecoder().decode(entry);
}
