/**
 * The client's plumbing: options, stored state, device keys, device-proof calls with the
 * CLOCK_SKEW retry, denial recording, certificate checks and the signed server time.
 * ActivationStoringClient (client-activation-store.ts) stores activations bound to the device
 * keys; LicensingClient (client.ts) adds the operations.
 */
import { verifyCertificate } from "./certificate.ts";
import { type ResolvedConfig, resolveConfig } from "./config.ts";
import { deniedAs, storeDenial } from "./denials.ts";
import { DeviceKeyStore, type LockManagerLike, platformLocks } from "./device-key-store.ts";
import { sha256Hex, utf8 } from "./encoding.ts";
import { SdkError, usageError, verificationError } from "./errors.ts";
import type { FetchLike } from "./http.ts";
import { canonicalize } from "./jcs.ts";
import { type DeviceKeys, type KeyAlgorithm, thumbprint } from "./keys.ts";
import { type BackoffOptions, defaultTimer, type Timer } from "./loop.ts";
import type { LicensingClientOptions } from "./options.ts";
import { newNonce } from "./proof.ts";
import type { ServerTime } from "./results.ts";
import { Runtime, type RuntimeResponse } from "./runtime.ts";
import { ClientState, type MachineInfo, type StoredActivation } from "./state.ts";
import { MemoryStorage } from "./storage.ts";
import { checkMaxUnconfirmedMs, TrustManager } from "./trust.ts";
import { isRecord, isString, serialized, unixSeconds } from "./util.ts";
import type { TrustBundle } from "./verify.ts";

export type { LicensingClientOptions } from "./options.ts";
export type { ActivateOptions, ActivationResult, HeartbeatResult, Lease, ServerTime } from "./results.ts";

export const SDK_VERSION = "0.1.0";
/** A fresh certificate's nbf may be this far after the signed server_time of its response. */
export const NBF_LEEWAY_SEC = 60;
const ISO_SECONDS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$/;

export function invalidResponse(message: string, details?: Record<string, unknown>): SdkError {
  return verificationError("RESPONSE_INVALID", message, details);
}

/** hex(SHA-256(JCS(machine_info))). */
export function machineInfoDigest(machineInfo: MachineInfo): string {
  return sha256Hex(utf8(canonicalize(machineInfo)));
}

export function checkMachineInfo(value: unknown): MachineInfo {
  if (!isRecord(value) || !isString(value.os) || !isString(value.arch)) {
    throw usageError("INVALID_ARGUMENT", "machineInfo needs string os and arch");
  }
  try {
    canonicalize(value);
  } catch (cause) {
    throw usageError("INVALID_ARGUMENT", "machineInfo is not JSON", { reason: String(cause) });
  }
  return value as MachineInfo;
}

export class ClientCore {
  readonly config: ResolvedConfig;
  protected readonly fetchImpl: FetchLike;
  protected readonly now: () => number;
  protected readonly sdkVersion: string;
  protected readonly appVersion: string;
  protected readonly signingAlgorithm: KeyAlgorithm;
  protected readonly timer: Timer;
  protected readonly random: () => number;
  protected readonly backoff: BackoffOptions;
  protected readonly state: ClientState;
  protected readonly trust: TrustManager;
  protected readonly runtime: Runtime;
  protected readonly keyStore: DeviceKeyStore;
  /** The origin-wide locks (Web Locks, or the `locks` option) other clients on the same storage honour. */
  protected readonly locks: LockManagerLike | undefined;
  protected clockOffsetSec = 0;
  /** The client's calls that must not overlap (activate, heartbeat, deactivate, ...). */
  protected readonly exclusive = serialized();

  constructor(options: LicensingClientOptions) {
    this.config = resolveConfig(options.config);
    const platformFetch = globalThis.fetch;
    this.fetchImpl =
      options.fetch ??
      ((url, init) => {
        if (typeof platformFetch !== "function") throw new Error("no fetch available; pass options.fetch");
        return platformFetch(url, init);
      });
    this.now = options.now ?? (() => Date.now());
    this.sdkVersion = options.sdkVersion ?? SDK_VERSION;
    this.appVersion = options.appVersion ?? "0.0.0";
    this.signingAlgorithm = options.signingAlgorithm ?? "ed25519";
    this.timer = options.timer ?? defaultTimer;
    this.random = options.random ?? Math.random;
    this.backoff = options.backoff ?? {};
    const prefix = `svc.v1.${this.config.environment}.${this.config.productId}.`;
    this.state = new ClientState(options.storage ?? new MemoryStorage(), prefix);
    this.locks = options.locks ?? platformLocks();
    this.keyStore = new DeviceKeyStore(this.state, this.signingAlgorithm, this.locks);
    this.trust = new TrustManager(
      this.config,
      this.fetchImpl,
      this.state,
      this.now,
      options.trustBundleMaxAgeMs ?? 3_600_000,
      checkMaxUnconfirmedMs(options.trustBundleMaxUnconfirmedMs),
    );
    this.runtime = new Runtime(
      this.config,
      this.fetchImpl,
      this.trust,
      this.now,
      async (assertion, receivedAtMs, fresh) => {
        await this.state.setTimeHighWater(assertion.server_time, { fresh });
        // Verified time is the truth: a local clock that ran ahead and was corrected is forgiven
        // (the mark restarts at the server's time, not at this clock's reading of it). Not by an
        // answer overtaken by newer ones or long on its way: it may have been held back to wind
        // the marks back.
        await this.state.setLocalHighWater(assertion.server_time, { reset: fresh });
        if (fresh) this.clockOffsetSec = assertion.server_time - unixSeconds(receivedAtMs);
      },
      options.monotonicNow ?? (() => performance.now()),
    );
  }

  // ---- keys and stored state -------------------------------------------------------------

  /** This device's keys as storage holds them now; generated on first use (device-key-store.ts). */
  deviceKeys(): Promise<DeviceKeys> {
    return this.keyStore.current();
  }

  /** Replaces the device keys (e.g. restored from a backup). Refused while activated. */
  setDeviceKeys(keys: DeviceKeys): Promise<void> {
    return this.keyStore.replace(keys, async () => {
      if (await this.storedActivation())
        throw usageError("ALREADY_ACTIVATED", "deactivate before changing keys");
    });
  }

  async activationId(): Promise<string | undefined> {
    return (await this.storedActivation())?.activation_id;
  }

  /** The verified trust bundle (refetched when stale). */
  trustBundle(): Promise<TrustBundle> {
    return this.trust.current();
  }

  protected storedActivation(): Promise<StoredActivation | undefined> {
    return this.state.getJson<StoredActivation>("activation");
  }

  protected async requireActivation(): Promise<StoredActivation> {
    const act = await this.storedActivation();
    if (!act) throw usageError("NOT_ACTIVATED", "this device is not activated");
    return act;
  }

  /** Unix seconds, corrected by the offset learned from the last verified server_time. */
  protected timestamp(): number {
    return unixSeconds(this.now()) + this.clockOffsetSec;
  }

  /** Runs `attempt`; on an unsigned 401 CLOCK_SKEW, learns the signed server time and retries once. */
  protected async withClockSkewRetry<T>(attempt: () => Promise<T>): Promise<T> {
    try {
      return await attempt();
    } catch (error) {
      if (!(error instanceof SdkError && error.kind === "server" && error.code === "CLOCK_SKEW")) throw error;
      await this.serverTime();
      return attempt();
    }
  }

  protected dpCall(
    method: "POST" | "DELETE",
    path: string,
    body: Record<string, unknown> | undefined,
    act: StoredActivation,
    keys: DeviceKeys,
  ): Promise<RuntimeResponse> {
    return this.withClockSkewRetry(() =>
      this.runtime.call({
        method,
        path,
        ...(body === undefined ? {} : { body }),
        nonce: newNonce(),
        deviceProof: { keys, activationId: act.activation_id, timestamp: this.timestamp() },
      }),
    );
  }

  /**
   * Records an authentic license-state denial for this activation; returns the error to throw.
   * Every caller's call carried this activation's device proof, so Runtime has already refused a
   * denial whose signed details name another activation (protocol §16). `fromHeartbeat`: the call
   * was a heartbeat (they run one at a time, so its denial is the newest word; denials.ts).
   */
  protected async recordDenial(
    error: unknown,
    act: StoredActivation,
    options = { fromHeartbeat: false },
  ): Promise<unknown> {
    if (!(error instanceof SdkError) || error.kind !== "license") return error;
    const denial = deniedAs(error, act.activation_id);
    await this.state.activationRecords(async () => {
      // An answer about an activation this client no longer holds (it deactivated and activated
      // again while the call was in flight) changes nothing stored.
      if ((await this.storedActivation())?.activation_id !== act.activation_id) return;
      await storeDenial(this.state, denial, { ...options, licenseId: act.license_id });
    });
    return error;
  }

  protected verifyCert(
    jws: unknown,
    bundle: TrustBundle,
    keys: DeviceKeys,
    activationId: string,
    at?: number,
  ) {
    if (!isString(jws)) throw invalidResponse("certificate missing");
    return verifyCertificate(jws, {
      bundle,
      productId: this.config.productId,
      deviceThumbprint: thumbprint(keys.signing.publicKey),
      activationId,
      ...(at === undefined ? {} : { notBeforeCheckAt: at, nbfLeewaySec: NBF_LEEWAY_SEC }),
    });
  }

  // ---- runtime operations ----------------------------------------------------------------

  /** POST /runtime/v1/time: the signed server time; also updates the tamper high-water mark. */
  async serverTime(): Promise<ServerTime> {
    const nonce = newNonce();
    const res = await this.runtime.call({
      method: "POST",
      path: "/runtime/v1/time",
      body: { product_id: this.config.productId, nonce, sdk_version: this.sdkVersion },
      nonce,
    });
    const iso = res.data;
    if (!isString(iso) || !ISO_SECONDS.test(iso))
      throw invalidResponse("time data is not an ISO 8601 UTC time");
    const ms = Date.parse(iso);
    if (Number.isNaN(ms) || new Date(ms).toISOString() !== iso.replace("Z", ".000Z")) {
      throw invalidResponse("time data is not a real date", { data: iso });
    }
    if (ms / 1000 !== res.assertion.server_time) {
      throw verificationError("TIME_MISMATCH", "time data differs from the signed server_time", {
        data: iso,
      });
    }
    return { serverTime: ms / 1000, iso };
  }
}
