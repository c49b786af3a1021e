/**
 * Storing an activation the service answered (activation create, trial confirm) or an offline
 * package brought, bound to the device keys storage holds: other clients on the same storage
 * (browser tabs) and the app itself change those keys under a running client. An activation whose
 * keys are no longer the device's is given back to the service, and an activation request is
 * made once more with the keys now stored.
 */
import { ClientCore, invalidResponse } from "./core.ts";
import { storeActivationRefusal, storeReportedStatus } from "./denials.ts";
import { SdkError, usageError, verificationError } from "./errors.ts";
import type { DeviceKeys } from "./keys.ts";
import type { ActivationResult } from "./results.ts";
import type { RuntimeResponse } from "./runtime.ts";
import type { MachineInfo, StoredActivation } from "./state.ts";

export class ActivationStoringClient extends ClientCore {
  /**
   * Runs an activation request with the device keys storage holds, and once more when its answer
   * was refused as DEVICE_KEYS_CHANGED: another client on this storage wrote other keys while it
   * was in flight. Two browser tabs at first run do so despite the Web Lock their key writes take
   * turns under, since the lock does not make `localStorage` show one tab's write to the other at
   * once. By then acceptActivation has given the refused activation's slot back (awaited: on a
   * license of one machine the second request finds the slot free), and the second request,
   * signed with the keys now stored, gets their activation back from the service (the other tab's)
   * or a new one. Once only: keys that change again fail the call as before.
   */
  protected async withStoredKeys<T>(request: (keys: DeviceKeys) => Promise<T>): Promise<T> {
    try {
      return await request(await this.deviceKeys());
    } catch (error) {
      if (!(error instanceof SdkError && error.code === "DEVICE_KEYS_CHANGED")) throw error;
      return request(await this.deviceKeys());
    }
  }

  /**
   * The fields every request that binds this device carries (activation create, trial confirm),
   * before the request's own and its proof.
   */
  protected deviceFields(
    keys: DeviceKeys,
    machineInfo: MachineInfo,
    signals: Record<string, string>,
    nonce: string,
  ): Record<string, unknown> {
    return {
      device_signing_public_key: keys.signing.publicKey,
      device_kem_public_key: keys.kem.publicKey,
      machine_info: machineInfo,
      machine_signals: signals,
      app_version: this.appVersion,
      sdk_version: this.sdkVersion,
      client_time: this.timestamp(),
      nonce,
    };
  }

  /**
   * Remembers a signed license-state denial of an activation request by the license it names,
   * against that license's older offline packages (denials.ts); returns the error to throw.
   */
  protected async recordActivationRefusal(error: unknown): Promise<unknown> {
    if (!(error instanceof SdkError) || error.kind !== "license") return error;
    await this.state.activationRecords(() => storeActivationRefusal(this.state, error));
    return error;
  }

  /**
   * The data of an activation answer (activation create or trial confirm), once its envelope
   * verified: the digest must be ours and the certificate must bind this device and activation;
   * then the activation becomes this client's, replacing any denial and heartbeat state.
   */
  protected async acceptActivation(
    res: RuntimeResponse,
    data: { readonly [field: string]: unknown },
    activationId: string,
    keys: DeviceKeys,
    machineInfo: MachineInfo,
    digest: string,
    /** A trial confirmation's: the license its data names, which the certificate must name. */
    trialLicenseId?: string,
  ): Promise<ActivationResult> {
    if (data.machine_info_digest !== digest) {
      throw verificationError("MACHINE_INFO_DIGEST_MISMATCH", "server digest differs from ours", {
        expected: digest,
        received: data.machine_info_digest,
      });
    }
    const cert = this.verifyCert(data.certificate, res.bundle, keys, activationId, res.assertion.server_time);
    if (trialLicenseId !== undefined && cert.claims.sub !== trialLicenseId)
      throw invalidResponse("the certificate names another license than license_id");
    const activation: StoredActivation = {
      activation_id: activationId,
      license_id: cert.claims.sub,
      machine_info: machineInfo,
      machine_info_digest: digest,
    };
    try {
      // A trial's code is spent and its verification bound to the keys that started it: a new
      // start, with the keys now stored, joins the trial just made.
      const retry =
        trialLicenseId === undefined
          ? { retryable: true, hint: "try again" }
          : { retryable: false, hint: "start the trial again" };
      await this.storeBoundToKeys(keys, activationId, retry, async () => {
        // The service refuses to activate a suspended license, so its certificates say "active";
        // one that said otherwise would be remembered as a heartbeat's is (denials.ts).
        await storeReportedStatus(this.state, {
          licenseId: cert.claims.sub,
          activationId,
          statuses: [cert.claims.license.status],
          serverTime: res.assertion.server_time,
          requestId: res.assertion.request_id,
        });
        // Another client on this storage (a tab, with the same keys) stored its activation while
        // this one was in flight: overwriting it would leave one of the two server slots held by
        // an activation nothing on the device knows of. The same activation (the service answers
        // the same keys and license so) is taken again.
        const held = await this.storedActivation();
        if (held && held.activation_id !== activationId)
          throw usageError(
            "ALREADY_ACTIVATED",
            "another client on this storage activated this device while the activation was in flight; it was not stored, read activationId()",
            { activation_id: activationId, held_activation_id: held.activation_id },
          );
        // The activation last: a write failing before it (a full quota) leaves none, and a retry
        // with these keys gets the same one back from the server; an activation stored without
        // its certificate would stay invalid and refuse the retry as ALREADY_ACTIVATED.
        await this.state.delete("denial");
        await this.state.delete("last_heartbeat");
        await this.state.setNewestAnswer(res.assertion.server_time, { reset: true });
        await this.state.set("certificate", cert.jws);
        await this.state.setJson("activation", activation);
      });
    } catch (error) {
      // Not stored, and its keys or its place are another's: nothing could use or deactivate it.
      if (
        error instanceof SdkError &&
        (error.code === "DEVICE_KEYS_CHANGED" || error.code === "ALREADY_ACTIVATED")
      )
        await this.releaseOrphan(activation, keys);
      throw error;
    }
    return {
      activationId: activationId,
      licenseId: cert.claims.sub,
      machineInfoDigest: digest,
      certificate: cert.claims,
      serverTime: res.assertion.server_time,
    };
  }

  /**
   * Runs `store` (the checks and writes that make `activationId` the stored activation) holding
   * the activation records and the device-keys lock, once storage is known to hold `keys`, the
   * keys the activation is bound to: written back when storage holds none (the app cleared it
   * meanwhile), refused with DEVICE_KEYS_CHANGED and nothing stored when it holds others
   * (another client on the same storage replaced them); `retry` says what to do then. The trust
   * bundle held in memory is written back first, so the certificate stored verifies after a
   * restart.
   */
  protected async storeBoundToKeys(
    keys: DeviceKeys,
    activationId: string,
    retry: { retryable: boolean; hint: string },
    store: () => Promise<void>,
  ): Promise<void> {
    await this.trust.restoreStored();
    const bound = await this.state.activationRecords(() =>
      this.keyStore.underLock(async () => {
        if (!(await this.keyStore.bind(keys))) return false;
        await store();
        return true;
      }),
    );
    if (!bound)
      throw new SdkError(
        "DEVICE_KEYS_CHANGED",
        `another client on this storage replaced the device keys the activation is bound to; it was not stored, ${retry.hint}`,
        { kind: "storage", retryable: retry.retryable, details: { activation_id: activationId } },
      );
  }

  /**
   * Gives back the slot of an activation not stored (its keys are no longer this device's, or
   * another activation was stored meanwhile), so nothing could use or deactivate it. Best effort:
   * a slot left behind is culled once stale.
   */
  private async releaseOrphan(activation: StoredActivation, keys: DeviceKeys): Promise<void> {
    const path = `/runtime/v1/activations/${encodeURIComponent(activation.activation_id)}`;
    await this.dpCall("DELETE", path, undefined, activation, keys).catch(() => undefined);
  }
}
