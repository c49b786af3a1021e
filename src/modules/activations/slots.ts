import type { Deps } from "../../deps.ts";
import { ApiError } from "../../http/errors.ts";
import type { LicenseRow } from "../licenses/service.ts";
import type { PolicyWithId } from "./gate.ts";
import type { ActivationRow } from "./service.ts";

/**
 * A license's machine slots (max_machines): how many its devices hold, whether a new device may
 * take one, and whether a stale device coming back has lost its own. Activation, heartbeat and
 * offline binding all ask here, so the three agree on who holds a slot.
 */
export class MachineSlots {
  private readonly countSlots;
  private readonly activeCount;

  constructor(deps: Pick<Deps, "sqlite">) {
    this.activeCount = deps.sqlite.prepare<{ active: number }, [string]>(
      "SELECT active FROM activation_counts WHERE license_id = ?",
    );
    this.countSlots = deps.sqlite.prepare<{ n: number }, [string, number, number, number]>(
      `SELECT count(*) AS n FROM activations WHERE license_id = ? AND status = 'active'
       AND (? = 0 OR coalesce(last_heartbeat_at, activated_at) >= ? OR offline_until > ?)`,
    );
  }

  /**
   * Slots held on a license. For policies that require heartbeats, a device stops holding its
   * slot once heartbeat_sec + network_grace_sec have passed since it last checked in, unless an
   * unexpired offline package binds it (it cannot check in, and holds its slot until then).
   */
  inUse(licenseId: string, policy: PolicyWithId, now: Date): number {
    const freshSince = policy.heartbeat_required
      ? now.getTime() - (policy.heartbeat_sec + policy.network_grace_sec) * 1000
      : 0;
    return (
      this.countSlots.get(licenseId, policy.heartbeat_required ? 1 : 0, freshSince, now.getTime())?.n ?? 0
    );
  }

  /**
   * Whether every machine slot is taken. Fewer active activations than slots (one row, kept by
   * triggers) means room without counting who is fresh: only a full license pays for the count.
   */
  full(licenseId: string, policy: PolicyWithId, maxMachines: number, now: Date): boolean {
    const active = this.activeCount.get(licenseId)?.active ?? 0;
    if (active < maxMachines) return false;
    return this.inUse(licenseId, policy, now) >= maxMachines;
  }

  /** Throws MACHINE_LIMIT_REACHED unless a new device may take a slot (online or offline). */
  requireFree(license: LicenseRow, policy: PolicyWithId, now: Date): void {
    const maxMachines = license.maxMachinesOverride ?? policy.max_machines;
    if (this.full(license.id, policy, maxMachines, now)) {
      throw new ApiError("MACHINE_LIMIT_REACHED", "Every machine slot of this license is in use.", {
        max_machines: maxMachines,
      });
    }
  }

  /** A stale device coming back finds its slot taken when the fresh ones already fill the license. */
  culled(activation: ActivationRow, license: LicenseRow, policy: PolicyWithId, now: Date): boolean {
    if (!policy.heartbeat_required) return false;
    if (activation.offlineUntil && activation.offlineUntil.getTime() > now.getTime()) return false;
    const lastSeen = (activation.lastHeartbeatAt ?? activation.activatedAt).getTime();
    if (lastSeen >= now.getTime() - (policy.heartbeat_sec + policy.network_grace_sec) * 1000) return false;
    return this.full(license.id, policy, license.maxMachinesOverride ?? policy.max_machines, now);
  }
}
