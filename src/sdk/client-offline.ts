/**
 * What LicensingClient adds for devices that never go online and for sealed files: the offline
 * request, loading a verified offline package as the device's certificate, the license state read
 * from the stored certificate with no network use, and opening a sealed file as a stream once its
 * key has come from the service.
 */
import type { VerifiedCertificate } from "./certificate.ts";
import { ActivationStoringClient } from "./client-activation-store.ts";
import { checkMachineInfo, type LicensingClientOptions, machineInfoDigest } from "./core.ts";
import { overtakenBy, standingDenial, standingLicenseDenial } from "./denials.ts";
import { b64uDecodeLength } from "./encoding.ts";
import { SdkError, usageError, verificationError } from "./errors.ts";
import { hpkeOpen } from "./hpke.ts";
import { canonicalize } from "./jcs.ts";
import { type DeviceKeys, importDeviceKeys } from "./keys.ts";
import { evaluateLicense, type LicenseInfo, type LicenseState } from "./license.ts";
import {
  createOfflineRequest,
  type OfflineManifest,
  type OfflineRequest,
  verifyOfflinePackage,
} from "./offline.ts";
import { newNonce } from "./proof.ts";
import { refuseReplacedSince, refuseUnlessNewerThanHeld } from "./replacements.ts";
import {
  ByteReader,
  type ByteSource,
  decryptSealedPayload,
  readSealedHeader,
  SEALED_INFO,
  type SealedHeader,
  sealedCore,
} from "./sealed.ts";
import { type CachedFileKey, checkSealedFileKeyCacheSize, SealedFileKeyCache } from "./sealed-key-cache.ts";
import type { MachineInfo, StoredActivation, StoredDenial, StoredHeartbeat } from "./state.ts";
import { isRecord, isString, unixSeconds } from "./util.ts";
import type { TrustBundle } from "./verify.ts";

export interface OfflinePackageInfo {
  activationId: string;
  licenseId: string;
  manifest: OfflineManifest;
  /** The package expiry (Unix seconds): also the certificate's `exp`. */
  expiresAt: number;
  /**
   * The activation this package replaced on the device, if it did: the service still counts its
   * machine slot until the vendor deactivates it (or it is culled).
   */
  replacedActivationId?: string;
}

export interface OpenedSealedFile {
  header: SealedHeader;
  fileId: string;
  /** The plaintext; errors with SEALED_FILE_TRUNCATED, _TRAILING_DATA or _TAMPERED. */
  stream: ReadableStream<Uint8Array>;
}

/** The states in which the device may use what its license grants. */
const stands = (info: LicenseInfo): boolean => info.state === "valid" || info.state === "grace";

export class OfflineCapableClient extends ActivationStoringClient {
  /** openSealedFile's key answers. */
  private readonly sealedKeys: SealedFileKeyCache;

  constructor(options: LicensingClientOptions) {
    super(options);
    this.sealedKeys = new SealedFileKeyCache(
      this.state,
      checkSealedFileKeyCacheSize(options.sealedFileKeyCacheSize),
      this.locks,
    );
  }

  /**
   * The request to hand to the vendor (as a JSON file) for an offline package. Generates device
   * keys on first use. The machine_info is remembered for the package that comes back.
   */
  async createOfflineRequest(options: { machineInfo: MachineInfo }): Promise<OfflineRequest> {
    const machineInfo = checkMachineInfo(options.machineInfo);
    const keys = await this.deviceKeys();
    await this.state.setJson("offline_request", {
      machine_info: machineInfo,
      machine_info_digest: machineInfoDigest(machineInfo),
    });
    return createOfflineRequest(keys, {
      productId: this.config.productId,
      machineInfo,
      generatedAt: unixSeconds(this.now()),
      nonce: newNonce(),
    });
  }

  /**
   * Verifies an offline package end to end with only the config's root key, and makes its
   * license.jwt this device's certificate: licenseState(), licenseInfo() and hasEntitlement() then
   * work from it with no network. Pass `machineInfo` when the request was made by another process.
   * A package of another activation than the one held replaces it when it was issued later than
   * the newest signed answer behind it (docs/sdk.md, "Devices that never go online").
   */
  loadOfflinePackage(
    zip: Uint8Array,
    options: { machineInfo?: MachineInfo } = {},
  ): Promise<OfflinePackageInfo> {
    return this.exclusive(async () => {
      if (!(zip instanceof Uint8Array)) throw usageError("INVALID_ARGUMENT", "the package must be bytes");
      const keys = await this.deviceKeys();
      const verified = verifyOfflinePackage(zip, {
        config: this.config,
        device: { signingPublicKey: keys.signing.publicKey, kemPublicKey: keys.kem.publicKey },
        ...(await this.trustedBundle()),
        // The floor too: with the stored bundle gone (a crash between the two writes), the
        // package's older bundle must not bring back a key this device knows is compromised.
        highestSequence: await this.state.bundleSequence(),
      });
      const { manifest, certificate } = verified;
      // Before any refusal: the bundle is authentic whatever becomes of the package, and a newer
      // one is how a device that never goes online learns of a key dropped after a revocation or
      // declared compromised (protocol §4). adopt() keeps the newer of it and the one held.
      if (verified.bundle === verified.signedBundle.bundle)
        await this.trust.adopt(verified.signedBundle, verified.signedBundle.bundle);
      // Not by this clock alone: one set back would take an expired package. A verified time
      // this device has seen is as late as the present at least.
      const now = Math.max(unixSeconds(this.now()), (await this.state.timeHighWater()) ?? 0);
      if (now >= manifest.expires_at)
        throw verificationError("PACKAGE_EXPIRED", "the offline package has expired", {
          expires_at: manifest.expires_at,
        });
      const activationId = certificate.claims.activation_id;
      const machineInfo = await this.machineInfoFor(
        certificate.claims.machine_info_digest,
        options.machineInfo,
      );
      await this.state.setTimeHighWater(manifest.issued_at, { fresh: false });
      const activation: StoredActivation = {
        activation_id: activationId,
        license_id: manifest.license_id,
        machine_info: machineInfo,
        machine_info_digest: certificate.claims.machine_info_digest,
      };
      let replaced: string | undefined;
      // Bound to the keys it was verified for, as an online activation is (core.ts); a retry
      // cannot help when storage holds other keys, since the package is for the replaced ones.
      const retry = { retryable: false, hint: "make a new offline request with the stored keys" };
      await this.storeBoundToKeys(keys, activationId, retry, async () => {
        // A package issued before a signed denial this device holds (an old package loaded again
        // after a revocation) does not lift it: the denial is the newer word. A denial of the
        // license itself stands against its packages for any activation (one the vendor made
        // after a force-deactivation), and after the denied activation is gone from the device.
        const denial =
          (await standingDenial(this.state, activationId, manifest.issued_at)) ??
          (await standingLicenseDenial(this.state, manifest.license_id, manifest.issued_at));
        if (denial) throw overtakenBy(denial, manifest.issued_at);
        // An activation that ended on this device (deactivated, or a signed 410) stays ended: its
        // machine slot may be another device's by now.
        if ((await this.state.endedActivations()).includes(activationId))
          throw verificationError(
            "PACKAGE_ACTIVATION_ENDED",
            "the package's activation has ended on this device; ask for a new package",
            { activation_id: activationId },
          );
        await refuseReplacedSince(this.state, activationId, manifest.issued_at);
        const held = await this.storedActivation();
        replaced = held && held.activation_id !== activationId ? held.activation_id : undefined;
        if (replaced !== undefined) await refuseUnlessNewerThanHeld(this.state, replaced, manifest.issued_at);
        // The device may have heard from the service since the package was made (a hybrid device
        // online meanwhile, or an issuing host whose clock is behind). The package still stands
        // for the same license terms, and may last longer; but it must not take back what the
        // newer word says (a suspension, fewer entitlements, an earlier end).
        const newest = replaced === undefined ? await this.state.newestAnswer() : undefined;
        const older = newest !== undefined && newest > manifest.issued_at;
        let keepStored = false;
        if (older) {
          const newer = await this.storedCertificateClaims(activationId, keys, verified.bundle);
          if (newer && canonicalize(newer.license) !== canonicalize(certificate.claims.license))
            throw verificationError(
              "PACKAGE_SUPERSEDED",
              "the package's license terms differ from newer ones this device holds; nothing changed",
              { issued_at: manifest.issued_at, newest_answer: newest },
            );
          // Same terms: the certificate that lasts longer is kept.
          keepStored = newer !== undefined && newer.exp >= certificate.claims.exp;
        }
        // First, so that a crash before the writes below leaves the old packages refused.
        if (replaced !== undefined) await this.state.recordReplacedActivation(replaced, manifest.issued_at);
        await this.state.setJson("activation", activation);
        if (!keepStored) await this.state.set("certificate", certificate.jws);
        // Any denial left is older than the package (standingDenial) or of the replaced
        // activation; a newer heartbeat of the same activation stays.
        await this.state.delete("denial");
        if (!older) await this.state.delete("last_heartbeat");
        await this.state.setNewestAnswer(manifest.issued_at, { reset: replaced !== undefined });
      });
      return {
        activationId,
        licenseId: manifest.license_id,
        manifest,
        expiresAt: manifest.expires_at,
        ...(replaced === undefined ? {} : { replacedActivationId: replaced }),
      };
    });
  }

  // ---- offline state (no network use) ---------------------------------------------------

  /** The license state from the cached certificate, re-verified against the cached bundle. */
  async licenseInfo(): Promise<LicenseInfo> {
    const activation = await this.storedActivation();
    const jws = await this.state.get("certificate");
    let certificate: VerifiedCertificate | "invalid" | undefined;
    if (activation && jws !== undefined) {
      certificate = "invalid";
      const bundle = await this.trust.cached();
      const storedKeys = await this.state.get("device_keys");
      if (bundle && storedKeys !== undefined) {
        try {
          certificate = this.verifyCert(jws, bundle, importDeviceKeys(storedKeys), activation.activation_id);
          if (certificate.claims.sub !== activation.license_id) certificate = "invalid";
        } catch {
          certificate = "invalid";
        }
      }
    }
    const nowSec = unixSeconds(this.now());
    const localHighWater = await this.state.localHighWater();
    // A question must answer while storage refuses writes (a full quota): the mark only stops
    // rising, and a clock set back is still caught against the mark already stored.
    await this.state.setLocalHighWater(nowSec).catch((error: unknown) => {
      if (!(error instanceof SdkError && error.code === "STORAGE_UNAVAILABLE")) throw error;
    });
    return evaluateLicense({
      nowSec,
      highWater: await this.state.timeHighWater(),
      localHighWater,
      activation,
      denial: await this.state.getJson<StoredDenial>("denial"),
      certificate,
      lastHeartbeat: await this.state.getJson<StoredHeartbeat>("last_heartbeat"),
    });
  }

  async licenseState(): Promise<LicenseState> {
    return (await this.licenseInfo()).state;
  }

  /** Valid or in grace; false too when the state cannot be read. */
  private licenseStands(): Promise<boolean> {
    return this.licenseInfo().then(stands, () => false);
  }

  /** True when the license is valid or in grace and the entitlement's value is `true`. */
  async hasEntitlement(name: string): Promise<boolean> {
    const info = await this.licenseInfo();
    return stands(info) && info.entitlements[name] === true;
  }

  /**
   * Opens a sealed file for reading: its header is read from `source`, the file key is fetched
   * once (device proof) and cached sealed to this device, and the plaintext streams out chunk by
   * chunk. Refusals from the service arrive as SdkError (kind "server": SEALED_FILE_INVALID,
   * SEALED_FILE_ENTITLEMENT_REQUIRED, PLAN_ENTITLEMENT_REQUIRED; kind "license" for revocation).
   */
  async openSealedFile(source: ByteSource): Promise<OpenedSealedFile> {
    // Before any request: without Web Crypto the key the service releases cannot be opened, and
    // the failure would read as a bad key. Browsers offer it in secure contexts only.
    if (!globalThis.crypto?.subtle)
      throw usageError(
        "CRYPTO_UNAVAILABLE",
        "Web Crypto (crypto.subtle) is unavailable, which sealed files need: in a browser, serve the app from https:// or http://localhost",
      );
    const reader = new ByteReader(source);
    try {
      const read = await readSealedHeader(reader);
      const dek = await this.fileKey(read.header, read.line, read.headerSha256);
      return {
        header: read.header,
        fileId: read.header.file_id,
        stream: decryptSealedPayload(reader, read.header, dek),
      };
    } catch (error) {
      await reader.cancel().catch(() => undefined);
      throw error;
    }
  }

  /**
   * The stored certificate's claims when it verifies for this activation and `keys` (the stored
   * ones, checked by the caller under the keys lock); undefined otherwise. A read the storage
   * fails is thrown, never taken for no certificate (which would skip the check the newer
   * certificate is for).
   */
  private async storedCertificateClaims(activationId: string, keys: DeviceKeys, fallback: TrustBundle) {
    const jws = await this.state.get("certificate");
    if (jws === undefined) return undefined;
    const bundle = (await this.trust.cached()) ?? fallback;
    try {
      return this.verifyCert(jws, bundle, keys, activationId).claims;
    } catch {
      return undefined;
    }
  }

  /** The newest bundle the device already trusts, if any, for checks of an older package. */
  private async trustedBundle() {
    const cached = await this.trust.cached();
    return cached ? { trustedBundle: cached } : {};
  }

  private async machineInfoFor(digest: string, given: MachineInfo | undefined): Promise<MachineInfo> {
    if (given !== undefined) {
      const info = checkMachineInfo(given);
      if (machineInfoDigest(info) === digest) return info;
      throw usageError("INVALID_ARGUMENT", "machineInfo is not the one the offline request was made with");
    }
    const stored = await this.state.getJson<{ machine_info: MachineInfo; machine_info_digest: string }>(
      "offline_request",
    );
    if (stored?.machine_info_digest === digest) return stored.machine_info;
    throw usageError("INVALID_ARGUMENT", "pass the machineInfo the offline request was made with");
  }

  private async fileKey(header: SealedHeader, line: string, headerSha256: string): Promise<Uint8Array> {
    const act = await this.requireActivation();
    const keys = await this.deviceKeys();
    const aad = `${sealedCore(header)}\n${act.activation_id}`;
    const open = async (entry: CachedFileKey) => {
      const dek = await hpkeOpen(
        keys.kem.secretKey,
        b64uDecodeLength(entry.enc, 65),
        b64uDecodeLength(entry.wrapped_key, 48),
        SEALED_INFO.device,
        aad,
      );
      if (dek.length !== 32) throw new Error("the data key is not 32 bytes");
      return dek;
    };
    const cached = await this.sealedKeys.get(headerSha256, act.activation_id);
    // The cache saves a round trip while this device's license stands; it is not the service's
    // word. Once the device knows it revoked, suspended or expired (or its clock was set back),
    // the service is asked again, and answers with its signed denial or a fresh key.
    if (cached && (await this.licenseStands())) {
      let dek: Uint8Array | undefined;
      try {
        dek = await open(cached);
      } catch {
        // Stale (new device keys): ask the service again below.
      }
      if (dek) {
        // Only which answers to keep when the cache is full: a failed write of it fails no open.
        await this.sealedKeys.touch(headerSha256).catch(() => undefined);
        return dek;
      }
    }
    const path = `/runtime/v1/activations/${encodeURIComponent(act.activation_id)}/sealed-file-keys`;
    let data: unknown;
    try {
      data = (await this.dpCall("POST", path, { header: line, sdk_version: this.sdkVersion }, act, keys))
        .data;
    } catch (error) {
      throw await this.recordDenial(error, act);
    }
    if (!isRecord(data) || !isString(data.enc) || !isString(data.wrapped_key))
      throw verificationError("RESPONSE_INVALID", "sealed-file key data malformed");
    if (
      data.activation_id !== act.activation_id ||
      data.file_id !== header.file_id ||
      data.header_sha256 !== headerSha256
    )
      throw verificationError("SEALED_FILE_MISMATCH", "the service answered for another file or activation");
    const entry: CachedFileKey = {
      activation_id: act.activation_id,
      enc: data.enc,
      wrapped_key: data.wrapped_key,
    };
    let dek: Uint8Array;
    try {
      dek = await open(entry);
    } catch (cause) {
      throw new SdkError("SEALED_FILE_KEY_INVALID", "the file key does not open with this device's KEM key", {
        kind: "verification",
        cause,
      });
    }
    await this.sealedKeys.put(headerSha256, entry);
    return dek;
  }
}
