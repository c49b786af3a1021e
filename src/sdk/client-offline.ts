/**
 * What LicensingClient adds for devices that never go online and for sealed files: the offline
 * request, loading a verified offline package as the device's certificate, and opening a sealed
 * file as a stream once its key has come from the service.
 */
import { ClientCore, checkMachineInfo, machineInfoDigest } from "./core.ts";
import { overtakenBy, standingDenial } from "./denials.ts";
import { b64uDecodeLength } from "./encoding.ts";
import { SdkError, usageError, verificationError } from "./errors.ts";
import { hpkeOpen } from "./hpke.ts";
import {
  createOfflineRequest,
  type OfflineManifest,
  type OfflineRequest,
  verifyOfflinePackage,
} from "./offline.ts";
import { newNonce } from "./proof.ts";
import {
  ByteReader,
  type ByteSource,
  decryptSealedPayload,
  readSealedHeader,
  SEALED_INFO,
  type SealedHeader,
  sealedCore,
} from "./sealed.ts";
import type { MachineInfo, StoredActivation } from "./state.ts";
import { isRecord, isString, unixSeconds } from "./util.ts";

export interface OfflinePackageInfo {
  activationId: string;
  licenseId: string;
  manifest: OfflineManifest;
  /** The package expiry (Unix seconds): also the certificate's `exp`. */
  expiresAt: number;
}

export interface OpenedSealedFile {
  header: SealedHeader;
  fileId: string;
  /** The plaintext; errors with SEALED_FILE_TRUNCATED, _TRAILING_DATA or _TAMPERED. */
  stream: ReadableStream<Uint8Array>;
}

interface CachedFileKey {
  activation_id: string;
  enc: string;
  wrapped_key: string;
}

export class OfflineCapableClient extends ClientCore {
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

  /** A package binds one activation: the device must hold none, or that one. */
  private async refuseAnotherActivation(activationId: string): Promise<void> {
    const current = await this.storedActivation();
    if (current && current.activation_id !== activationId)
      throw usageError("ALREADY_ACTIVATED", "this device holds another activation; deactivate it first");
  }

  /**
   * Verifies an offline package end to end with only the config's root key, and makes its
   * license.jwt this device's certificate: licenseState(), licenseInfo() and hasEntitlement() then
   * work from it with no network. Pass `machineInfo` when the request was made by another process.
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
      });
      const { manifest, certificate } = verified;
      if (unixSeconds(this.now()) >= manifest.expires_at)
        throw verificationError("PACKAGE_EXPIRED", "the offline package has expired", {
          expires_at: manifest.expires_at,
        });
      const activationId = certificate.claims.activation_id;
      await this.refuseAnotherActivation(activationId);
      const machineInfo = await this.machineInfoFor(
        certificate.claims.machine_info_digest,
        options.machineInfo,
      );
      if (verified.bundle === verified.signedBundle.bundle)
        await this.trust.adopt(verified.signedBundle, verified.signedBundle.bundle);
      await this.state.raiseTimeHighWater(manifest.issued_at);
      const activation: StoredActivation = {
        activation_id: activationId,
        license_id: manifest.license_id,
        machine_info: machineInfo,
        machine_info_digest: certificate.claims.machine_info_digest,
      };
      await this.state.activationRecords(async () => {
        // Again under the lock: the check above ran before the machine info was read.
        await this.refuseAnotherActivation(activationId);
        // A package issued before a signed denial this device holds (an old package loaded again
        // after a revocation) does not lift it: the denial is the newer word.
        const denial = await standingDenial(this.state, activationId, manifest.issued_at);
        if (denial) throw overtakenBy(denial, manifest.issued_at);
        await this.state.setJson("activation", activation);
        await this.state.set("certificate", certificate.jws);
        await this.state.delete("denial");
        await this.state.delete("last_heartbeat");
        await this.state.setNewestAnswer(manifest.issued_at);
      });
      return { activationId, licenseId: manifest.license_id, manifest, expiresAt: manifest.expires_at };
    });
  }

  /**
   * Opens a sealed file for reading: its header is read from `source`, the file key is fetched
   * once (device proof) and cached sealed to this device, and the plaintext streams out chunk by
   * chunk. Refusals from the service arrive as SdkError (kind "server": SEALED_FILE_INVALID,
   * SEALED_FILE_ENTITLEMENT_REQUIRED, PLAN_ENTITLEMENT_REQUIRED; kind "license" for revocation).
   */
  async openSealedFile(source: ByteSource): Promise<OpenedSealedFile> {
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
    const cache = (await this.state.getJson<Record<string, CachedFileKey>>("sealed_file_keys")) ?? {};
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
    const cached = cache[headerSha256];
    if (cached && cached.activation_id === act.activation_id) {
      try {
        return await open(cached);
      } catch {
        // Stale (new device keys): ask the service again below.
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
    await this.state.setJson("sealed_file_keys", { ...cache, [headerSha256]: entry });
    return dek;
  }
}
