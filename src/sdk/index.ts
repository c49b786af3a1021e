/**
 * Client SDK of the licensing service. Browser-safe (browsers, Node, Bun, Deno): depends only on
 * @noble/curves, @noble/hashes and @hpke/core (Web Crypto), uses Web Crypto random bytes and
 * AES-GCM, and an injected or global fetch.
 */

export {
  CERTIFICATE_TYP,
  type CertificateClaims,
  type CertificateHeader,
  decodeCertificate,
  type HeartbeatClaim,
  type LicenseClaim,
  type VerifiedCertificate,
  type VerifyCertificateOptions,
  verifyCertificate,
} from "./certificate.ts";
export { LicensingClient } from "./client.ts";
export type {
  ConfirmEmailVerificationOptions,
  EmailVerification,
  NamedUserToken,
  StartEmailVerificationOptions,
} from "./client-named-user.ts";
export type { OfflinePackageInfo, OpenedSealedFile } from "./client-offline.ts";
export type {
  ConfirmTrialOptions,
  StartTrialOptions,
  TrialVerification,
  VerificationStart,
} from "./client-trial.ts";
export {
  type Environment,
  type ResolvedConfig,
  resolveConfig,
  type ServiceConfig,
  type TrustAnchor,
} from "./config.ts";
export {
  type ActivateOptions,
  type ActivationResult,
  type HeartbeatResult,
  type Lease,
  type LicensingClientOptions,
  machineInfoDigest,
  NBF_LEEWAY_SEC,
  SDK_VERSION,
  type ServerTime,
} from "./core.ts";
export type { LockManagerLike } from "./device-key-store.ts";
export { b64uDecode, b64uEncode, hex, sha256Hex } from "./encoding.ts";
export {
  isLicenseDenialCode,
  LICENSE_DENIAL_CODES,
  type LicenseDenialCode,
  SdkError,
  type SdkErrorCode,
  type SdkErrorKind,
  type ServerErrorBody,
} from "./errors.ts";
export type { FetchLike, RequestInitLike, ResponseLike } from "./http.ts";
export {
  type EnumerableWebStorage,
  IndexedDbStorage,
  type IndexedDbStorageOptions,
} from "./indexeddb-storage.ts";
export { CanonicalizationError, canonicalize, type JsonValue } from "./jcs.ts";
export {
  type DeviceKeys,
  type ExportedDeviceKeys,
  exportDeviceKeys,
  generateDeviceKeys,
  importDeviceKeys,
  type KeyAlgorithm,
  type KeyPair,
  keyIdOf,
  keyPairFromSecret,
  parsePublicKey,
  sign,
  thumbprint,
  verifySignature,
} from "./keys.ts";
export {
  CLOCK_TAMPER_TOLERANCE_SEC,
  evaluateLicense,
  type LicenseInfo,
  type LicenseInputs,
  type LicenseReason,
  type LicenseState,
} from "./license.ts";
export {
  type BackoffOptions,
  delayAfterError,
  type HeartbeatLoopCallbacks,
  type LoopStopReason,
  MAX_RETRY_AFTER_MS,
  MAX_TIMER_MS,
  type Timer,
} from "./loop.ts";
export {
  createOfflineRequest,
  OFFLINE_PACKAGE_FORMAT,
  OFFLINE_REQUEST_FORMAT,
  type OfflineManifest,
  type OfflineRequest,
  PACKAGE_ENTRIES,
  type VerifiedOfflinePackage,
  type VerifyOfflinePackageOptions,
  verifyOfflinePackage,
} from "./offline.ts";
export {
  activationProofMessage,
  type DeviceProofInput,
  deviceProofHeaders,
  deviceProofMessage,
  NONCE_PATTERN,
  newIdempotencyKey,
  newNonce,
  PREFIX,
  signActivationProof,
  signTrialProof,
  trialProofMessage,
} from "./proof.ts";
export {
  ByteReader,
  type ByteSource,
  decryptSealedPayload,
  parseSealedHeader,
  readSealedHeader,
  SEALED_CHUNK_SIZE,
  SEALED_MAGIC,
  type SealedHeader,
  sealedCore,
} from "./sealed.ts";
export { DEFAULT_SEALED_FILE_KEY_CACHE_SIZE, MAX_SEALED_FILE_KEY_CACHE_SIZE } from "./sealed-key-cache.ts";
export type { MachineInfo } from "./state.ts";
export { LocalStorageAdapter, MemoryStorage, type Storage, type WebStorageLike } from "./storage.ts";
export { DEFAULT_TRUST_BUNDLE_MAX_UNCONFIRMED_MS, MAX_TRUST_BUNDLE_UNCONFIRMED_MS } from "./trust.ts";
export {
  type BundleKey,
  type Delegation,
  MAX_DELEGATION_SEC,
  type ResponseAssertion,
  type SignedTrustBundle,
  type TrustBundle,
  verifyEnvelope,
  verifyTrustBundle,
} from "./verify.ts";
