/**
 * LicensingClient: activation, heartbeats, deactivation, floating leases and signed server time
 * (the offline license state is in client-offline.ts). Every response passes the full
 * verification chain (runtime.ts) before anything is stored or returned.
 */
import { NamedUserCapableClient } from "./client-named-user.ts";
import {
  type ActivateOptions,
  type ActivationResult,
  checkMachineInfo,
  type HeartbeatResult,
  invalidResponse,
  type Lease,
  machineInfoDigest,
} from "./core.ts";
import { overtakenBy, standingDenial, storeReportedStatus } from "./denials.ts";
import { SdkError, usageError, verificationError } from "./errors.ts";
import { type DeviceKeys, thumbprint } from "./keys.ts";
import { HeartbeatLoop, type HeartbeatLoopCallbacks } from "./loop.ts";
import { newIdempotencyKey, newNonce, signActivationProof } from "./proof.ts";
import type { RuntimeResponse } from "./runtime.ts";
import type { MachineInfo, StoredHeartbeat } from "./state.ts";
import { isInt, isNonEmptyString, isNonNegativeInt, isRecord, isString } from "./util.ts";

export class LicensingClient extends NamedUserCapableClient {
  private loop: HeartbeatLoop<HeartbeatResult> | undefined;

  /**
   * POST /runtime/v1/activations. Generates device keys on first use. Made once more, with the
   * keys then stored, when another client on the same storage replaced the keys while it was in
   * flight (ActivationStoringClient.withStoredKeys).
   */
  activate(options: ActivateOptions): Promise<ActivationResult> {
    return this.exclusive(async () => {
      if (!isNonEmptyString(options.licenseKey))
        throw usageError("INVALID_ARGUMENT", "licenseKey is required");
      const machineInfo = checkMachineInfo(options.machineInfo);
      const signals = options.machineSignals ?? {};
      if (!isRecord(signals) || !Object.values(signals).every(isString)) {
        throw usageError("INVALID_ARGUMENT", "machineSignals must map strings to strings");
      }
      if (options.namedUserToken !== undefined && !isNonEmptyString(options.namedUserToken)) {
        throw usageError("INVALID_ARGUMENT", "namedUserToken must be a string");
      }
      if (await this.storedActivation())
        throw usageError("ALREADY_ACTIVATED", "this device is already activated");
      const digest = machineInfoDigest(machineInfo);
      return this.withStoredKeys((keys) =>
        this.requestActivation(options, machineInfo, signals, digest, keys),
      );
    });
  }

  /** One activation request signed with `keys`, and its answer stored bound to them. */
  private async requestActivation(
    options: ActivateOptions,
    machineInfo: MachineInfo,
    signals: Record<string, string>,
    digest: string,
    keys: DeviceKeys,
  ): Promise<ActivationResult> {
    let res: RuntimeResponse;
    try {
      res = await this.withClockSkewRetry(() => {
        const nonce = newNonce();
        const body: Record<string, unknown> = {
          license_key: options.licenseKey,
          product_id: this.config.productId,
          ...this.deviceFields(keys, machineInfo, signals, nonce),
          ...(options.namedUserToken === undefined ? {} : { named_user_token: options.namedUserToken }),
        };
        body.device_proof = signActivationProof(keys, body);
        const idempotencyKey = newIdempotencyKey();
        return this.runtime.call({
          method: "POST",
          path: "/runtime/v1/activations",
          body,
          nonce,
          idempotencyKey,
          denialSubject: { device_thumbprint: thumbprint(keys.signing.publicKey) },
        });
      });
    } catch (error) {
      throw await this.recordActivationRefusal(error);
    }
    const data = res.data;
    if (!isRecord(data) || !isNonEmptyString(data.activation_id))
      throw invalidResponse("activation data malformed");
    return this.acceptActivation(res, data, data.activation_id, keys, machineInfo, digest);
  }

  /**
   * POST /runtime/v1/activations/{id}/heartbeat. Sends the machine_info digest; when the server
   * answers 422 MACHINE_INFO_REQUIRED, retries once with the full machine_info. Pass
   * `machineInfo` to report a changed machine description directly.
   */
  heartbeat(options: { machineInfo?: MachineInfo } = {}): Promise<HeartbeatResult> {
    return this.exclusive(async () => {
      const act = await this.requireActivation();
      const keys = await this.deviceKeys();
      const path = `/runtime/v1/activations/${encodeURIComponent(act.activation_id)}/heartbeat`;
      const machineInfo =
        options.machineInfo === undefined ? act.machine_info : checkMachineInfo(options.machineInfo);
      let full = options.machineInfo !== undefined;
      const versions = { app_version: this.appVersion, sdk_version: this.sdkVersion };
      let res: RuntimeResponse;
      for (;;) {
        const body = full
          ? { machine_info: machineInfo, ...versions }
          : { machine_info_digest: act.machine_info_digest, ...versions };
        try {
          res = await this.dpCall("POST", path, body, act, keys);
          break;
        } catch (error) {
          if (
            !full &&
            error instanceof SdkError &&
            error.kind === "server" &&
            error.code === "MACHINE_INFO_REQUIRED"
          ) {
            full = true;
            storedMachineInfoSendable(machineInfo);
            continue;
          }
          throw await this.recordDenial(error, act, { fromHeartbeat: true });
        }
      }
      const expectedDigest = full ? machineInfoDigest(machineInfo) : act.machine_info_digest;
      const data = res.data;
      if (!isRecord(data)) throw invalidResponse("heartbeat data malformed");
      if (data.activation_id !== act.activation_id) {
        throw verificationError("ACTIVATION_MISMATCH", "heartbeat answer names another activation");
      }
      if (!isString(data.license_status) || !isNonNegativeInt(data.next_heartbeat_in)) {
        throw invalidResponse("heartbeat data malformed");
      }
      if (data.machine_info_digest !== expectedDigest) {
        throw verificationError("MACHINE_INFO_DIGEST_MISMATCH", "server digest differs from ours");
      }
      const cert = this.verifyCert(
        data.certificate,
        res.bundle,
        keys,
        act.activation_id,
        res.assertion.server_time,
      );
      if (cert.claims.sub !== act.license_id) {
        throw verificationError("CERTIFICATE_MISMATCH", "certificate is for another license", {
          sub: cert.claims.sub,
        });
      }
      const heartbeat: StoredHeartbeat = {
        license_status: data.license_status,
        next_heartbeat_in: data.next_heartbeat_in,
        server_time: res.assertion.server_time,
        received_at_ms: this.now(),
      };
      await this.state.activationRecords(async () => {
        // Before anything can refuse the answer: a suspension is reported only this way.
        await storeReportedStatus(this.state, {
          licenseId: act.license_id,
          activationId: act.activation_id,
          statuses: [data.license_status, cert.claims.license.status],
          serverTime: res.assertion.server_time,
          requestId: res.assertion.request_id,
        });
        // A lease call or a sealed-file key request (which do not wait for this one) may have
        // ended this activation while the heartbeat was in flight: its signed 410 is the newer
        // word, since the server answered this heartbeat before the activation ended.
        if ((await this.storedActivation())?.activation_id !== act.activation_id)
          throw usageError(
            "NOT_ACTIVATED",
            "this device's activation ended while the heartbeat was in flight",
          );
        // Likewise a signed denial of the same second or later: this answer is overtaken and
        // nothing of it is kept, or the app would hear "active" while licenseState() says revoked.
        const denial = await standingDenial(this.state, act.activation_id, res.assertion.server_time);
        if (denial) throw overtakenBy(denial, res.assertion.server_time);
        await this.state.set("certificate", cert.jws);
        if (full) {
          await this.state.setJson("activation", {
            ...act,
            machine_info: machineInfo,
            machine_info_digest: expectedDigest,
          });
        }
        await this.state.setJson("last_heartbeat", heartbeat);
        await this.state.setNewestAnswer(res.assertion.server_time);
        await this.state.delete("denial");
      });
      return {
        activationId: act.activation_id,
        licenseStatus: data.license_status,
        nextHeartbeatIn: data.next_heartbeat_in,
        machineInfoDigest: expectedDigest,
        certificate: cert.claims,
        serverTime: res.assertion.server_time,
      };
    });
  }

  /**
   * DELETE /runtime/v1/activations/{id}. Stops the heartbeat loop and forgets the activation
   * (device keys stay). An authentic ACTIVATION_DEACTIVATED also counts as done.
   */
  deactivate(): Promise<void> {
    return this.exclusive(async () => {
      const act = await this.requireActivation();
      const keys = await this.deviceKeys();
      this.stop();
      const path = `/runtime/v1/activations/${encodeURIComponent(act.activation_id)}`;
      try {
        const res = await this.dpCall("DELETE", path, undefined, act, keys);
        if (res.data !== "deactivated") throw invalidResponse('deactivation data is not "deactivated"');
      } catch (error) {
        const refused = await this.recordDenial(error, act);
        if (
          refused instanceof SdkError &&
          refused.kind === "license" &&
          refused.code === "ACTIVATION_DEACTIVATED"
        )
          return;
        throw refused;
      }
      await this.state.activationRecords(async () => {
        await this.state.clearActivation(act.activation_id);
        await this.state.delete("denial");
      });
    });
  }

  /**
   * A lease call signed by the stored activation. Its answer is bound to the request only by the
   * nonce, so the data must name that activation: another activation's lease, taken with an
   * intercepted nonce, would otherwise read as a seat this device holds (protocol §14).
   */
  private async leaseCall(
    method: "POST" | "DELETE",
    path: string,
    body: Record<string, unknown>,
  ): Promise<{ res: RuntimeResponse; data: Record<string, unknown> }> {
    const act = await this.requireActivation();
    const keys = await this.deviceKeys();
    let res: RuntimeResponse;
    try {
      res = await this.dpCall(method, path, body, act, keys);
    } catch (error) {
      throw await this.recordDenial(error, act);
    }
    const data = res.data;
    if (!isRecord(data)) throw invalidResponse("lease data malformed");
    // Servers before lease answers named their activation send none: refused as well (the answer
    // cannot be told from another activation's), but said for what it is, a server to upgrade.
    if (!("activation_id" in data)) {
      throw invalidResponse(
        "lease answer has no activation_id: the server is older than this SDK and must be upgraded before apps use this SDK",
        { field: "activation_id", server_upgrade_required: true },
      );
    }
    if (data.activation_id !== act.activation_id) {
      throw verificationError("ACTIVATION_MISMATCH", "lease answer names another activation");
    }
    return { res, data };
  }

  private readLease(
    { res, data: d }: { res: RuntimeResponse; data: Record<string, unknown> },
    instanceId: string,
    leaseId?: string,
  ): Lease {
    if (!isNonEmptyString(d.lease_id) || !isInt(d.expires_at) || !isNonNegativeInt(d.heartbeat_in)) {
      throw invalidResponse("lease data malformed");
    }
    if (d.instance_id !== instanceId || (leaseId !== undefined && d.lease_id !== leaseId)) {
      throw verificationError("LEASE_MISMATCH", "lease answer names another lease or instance");
    }
    return {
      leaseId: d.lease_id,
      instanceId,
      expiresAt: d.expires_at,
      heartbeatIn: d.heartbeat_in,
      serverTime: res.assertion.server_time,
    };
  }

  /** POST /runtime/v1/leases: takes a floating seat (409 CONCURRENCY_LIMIT_REACHED when full). */
  async acquireLease(instanceId: string): Promise<Lease> {
    if (!isNonEmptyString(instanceId)) throw usageError("INVALID_ARGUMENT", "instanceId is required");
    const act = await this.requireActivation();
    const answer = await this.leaseCall("POST", "/runtime/v1/leases", {
      activation_id: act.activation_id,
      instance_id: instanceId,
    });
    return this.readLease(answer, instanceId);
  }

  /** POST /runtime/v1/leases/{lease_id}/heartbeat. */
  async heartbeatLease(leaseId: string, instanceId: string): Promise<Lease> {
    if (!isNonEmptyString(leaseId) || !isNonEmptyString(instanceId)) {
      throw usageError("INVALID_ARGUMENT", "leaseId and instanceId are required");
    }
    const path = `/runtime/v1/leases/${encodeURIComponent(leaseId)}/heartbeat`;
    const answer = await this.leaseCall("POST", path, { instance_id: instanceId });
    return this.readLease(answer, instanceId, leaseId);
  }

  /** DELETE /runtime/v1/leases/{lease_id}. */
  async releaseLease(leaseId: string, instanceId: string): Promise<{ leaseId: string; status: "released" }> {
    if (!isNonEmptyString(leaseId) || !isNonEmptyString(instanceId)) {
      throw usageError("INVALID_ARGUMENT", "leaseId and instanceId are required");
    }
    const { data: d } = await this.leaseCall("DELETE", `/runtime/v1/leases/${encodeURIComponent(leaseId)}`, {
      instance_id: instanceId,
    });
    if (d.status !== "released") throw invalidResponse("release data malformed");
    if (d.lease_id !== leaseId)
      throw verificationError("LEASE_MISMATCH", "release answer names another lease");
    return { leaseId, status: "released" };
  }

  // ---- heartbeat loop ----------------------------------------------------------------------

  /**
   * Starts heartbeating: now, or when the last verified heartbeat's next_heartbeat_in runs out.
   * See loop.ts for retry and stop rules.
   */
  async startHeartbeatLoop(callbacks: HeartbeatLoopCallbacks<HeartbeatResult> = {}): Promise<void> {
    await this.requireActivation();
    if (this.loop?.running) return;
    // One that cannot be read waits for nothing: the first heartbeat replaces it.
    const last = await this.state.getJsonOrNone<StoredHeartbeat>("last_heartbeat");
    let delay = 0;
    if (last) {
      const interval = last.next_heartbeat_in * 1000;
      delay = Math.min(interval, Math.max(0, last.received_at_ms + interval - this.now()));
    }
    if (this.loop?.running) return;
    this.loop = new HeartbeatLoop(() => this.heartbeat(), this.timer, this.random, this.backoff, callbacks);
    this.loop.start(delay);
  }

  /** Stops the heartbeat loop (an in-flight heartbeat finishes but schedules nothing). */
  stop(): void {
    this.loop?.stop();
  }

  get heartbeatLoopRunning(): boolean {
    return this.loop?.running ?? false;
  }
}

/**
 * The stored machine_info, about to be sent in full because the server asked for it, must still
 * be JSON the request can be signed over; one that storage mangled says so, and how to repair it.
 */
function storedMachineInfoSendable(machineInfo: MachineInfo): void {
  try {
    checkMachineInfo(machineInfo);
  } catch (cause) {
    throw new SdkError(
      "STORAGE_CORRUPT",
      "the stored machine_info cannot be sent; pass heartbeat({ machineInfo }) to replace it",
      { kind: "storage", cause },
    );
  }
}
