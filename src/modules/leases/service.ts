import { and, eq, gt } from "drizzle-orm";
import type { Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import type { DeviceProofHeaders } from "../../http/device-proof.ts";
import { proofInvalid } from "../../http/device-proof.ts";
import { ApiError } from "../../http/errors.ts";
import { leases } from "../../store/schema/index.ts";
import type { RuntimeCall, RuntimeGate, SignedResult } from "../activations/gate.ts";
import type { ActivationService } from "../activations/service.ts";

export type LeaseRow = typeof leases.$inferSelect;

/**
 * `lease_ttl_sec` from now, but never past the license's expiry: a seat is not signed for time
 * the license does not have, as the certificate is not. Its seat frees when the license ends.
 */
const leaseExpiry = (license: { expiresAt: Date | null }, ttlSec: number, now: Date): Date => {
  const full = now.getTime() + ttlSec * 1000;
  return new Date(license.expiresAt ? Math.min(full, license.expiresAt.getTime()) : full);
};

interface LeaseData {
  lease_id: string;
  activation_id: string;
  instance_id: string;
  expires_at: number;
  heartbeat_in: number;
}

/**
 * Floating seats. A lease lives `lease_ttl_sec` past its last heartbeat; an expired lease frees
 * its seat without any sweeper, because seats are counted as unexpired active leases.
 */
export class LeaseService {
  private readonly seatsByInstance;
  private readonly seatsByDevice;
  private readonly heldByDevice;
  private readonly activeLeases;

  constructor(
    private readonly deps: Deps,
    private readonly gate: RuntimeGate,
    /** Seats follow slots: a device culled from its machine slot gets no seat either. */
    private readonly slots: Pick<ActivationService, "cullIfDisplaced">,
  ) {
    this.seatsByInstance = deps.sqlite.prepare<{ n: number }, [string, number]>(
      "SELECT count(*) AS n FROM leases WHERE license_id = ? AND status = 'active' AND expires_at > ?",
    );
    this.seatsByDevice = deps.sqlite.prepare<{ n: number }, [string, number]>(
      "SELECT count(DISTINCT activation_id) AS n FROM leases WHERE license_id = ? AND status = 'active' AND expires_at > ?",
    );
    this.activeLeases = deps.sqlite.prepare<{ active: number }, [string]>(
      "SELECT active FROM lease_counts WHERE license_id = ?",
    );
    this.heldByDevice = deps.sqlite.prepare<{ n: number }, [string, number]>(
      "SELECT count(*) AS n FROM leases WHERE activation_id = ? AND status = 'active' AND expires_at > ?",
    );
  }

  acquire(
    body: { activation_id: string; instance_id: string },
    proof: DeviceProofHeaders,
    call: RuntimeCall,
  ): Promise<SignedResult<LeaseData>> {
    const target = { activationId: body.activation_id };
    return this.gate.observe("lease_create", target, call, () => {
      if (proof.activationId !== body.activation_id) throw proofInvalid("activation_mismatch");
      const { activation, license, policy, now, signedFor } = this.gate.authenticate(
        body.activation_id,
        proof,
        call,
        target,
      );
      // A named user's device whose assignment ended takes no seat, as it gets no heartbeat.
      this.gate.denyDeviceUse("lease", { activation, license, policy, now, signedFor });
      this.slots.cullIfDisplaced(activation, license, policy, now, signedFor);
      const expiresAt = leaseExpiry(license, policy.lease_ttl_sec, now);
      const lease = this.deps.db.transaction(
        (tx) => {
          const held = tx
            .select()
            .from(leases)
            .where(
              and(
                eq(leases.activationId, activation.id),
                eq(leases.instanceId, body.instance_id),
                eq(leases.status, "active"),
                gt(leases.expiresAt, now),
              ),
            )
            .get();
          if (held) {
            tx.update(leases).set({ expiresAt }).where(eq(leases.id, held.id)).run();
            return { ...held, expiresAt };
          }
          const limit = license.maxConcurrentOverride ?? policy.max_concurrent;
          const needsSeat =
            policy.concurrency_unit === "instance" || !this.deviceHoldsSeat(activation.id, now);
          if (
            limit !== null &&
            needsSeat &&
            this.seatsFull(license.id, policy.concurrency_unit, limit, now)
          ) {
            throw new ApiError(
              "CONCURRENCY_LIMIT_REACHED",
              "Every concurrent seat of this license is taken.",
              {
                max_concurrent: limit,
              },
            );
          }
          const row: LeaseRow = {
            id: this.deps.ids.next("lease", now.getTime()),
            licenseId: license.id,
            activationId: activation.id,
            instanceId: body.instance_id,
            status: "active",
            createdAt: now,
            expiresAt,
            releasedAt: null,
          };
          tx.insert(leases).values(row).run();
          return row;
        },
        { behavior: "immediate" },
      );
      return { data: present(lease, policy.lease_heartbeat_sec), ...signedFor };
    });
  }

  heartbeat(
    leaseId: string,
    instanceId: string,
    proof: DeviceProofHeaders,
    call: RuntimeCall,
  ): Promise<SignedResult<LeaseData>> {
    const target = {};
    return this.gate.observe("lease_heartbeat", target, call, () => {
      const { lease, activation, license, policy, now, signedFor } = this.leaseFor(
        leaseId,
        proof,
        call,
        target,
      );
      // License and activation state first (spec §3.2 rule 1), then the lease's own state.
      this.gate.denyDeviceUse("lease", { activation, license, policy, now, signedFor });
      this.slots.cullIfDisplaced(activation, license, policy, now, signedFor);
      if (lease.instanceId !== instanceId) throw instanceMismatch();
      if (lease.status === "released")
        throw new ApiError("LEASE_RELEASED", "The lease was released; acquire a new one.");
      if (lease.expiresAt.getTime() <= now.getTime()) throw expired();
      const expiresAt = leaseExpiry(license, policy.lease_ttl_sec, now);
      this.deps.db.update(leases).set({ expiresAt }).where(eq(leases.id, lease.id)).run();
      return { data: present({ ...lease, expiresAt }, policy.lease_heartbeat_sec), ...signedFor };
    });
  }

  /**
   * A lease is released once: releasing a released or expired lease is a failed transition (422),
   * as the spec's release errors say; the seat is free either way.
   */
  release(
    leaseId: string,
    instanceId: string,
    proof: DeviceProofHeaders,
    call: RuntimeCall,
  ): Promise<SignedResult<{ lease_id: string; activation_id: string; status: "released" }>> {
    const target = {};
    return this.gate.observe("lease_release", target, call, () => {
      const { lease, now, signedFor } = this.leaseFor(leaseId, proof, call, target);
      if (lease.instanceId !== instanceId) throw instanceMismatch();
      if (lease.status === "released") {
        throw new ApiError("INVALID_TRANSITION", "The lease was already released.", {
          from: "released",
          to: "released",
        });
      }
      if (lease.expiresAt.getTime() <= now.getTime()) throw expired();
      this.deps.db
        .update(leases)
        .set({ status: "released", releasedAt: now })
        .where(eq(leases.id, lease.id))
        .run();
      return {
        data: { lease_id: lease.id, activation_id: lease.activationId, status: "released" as const },
        ...signedFor,
      };
    });
  }

  /** The lease, which must belong to the activation that signed the proof (else it does not exist). */
  private leaseFor(
    leaseId: string,
    proof: DeviceProofHeaders,
    call: RuntimeCall,
    target: { activationId?: string | null },
  ) {
    const auth = this.gate.authenticate(null, proof, call, target);
    const lease = this.deps.db.select().from(leases).where(eq(leases.id, leaseId)).get();
    if (!lease || lease.activationId !== auth.activation.id) throw ApiError.notFound("lease");
    return { lease, ...auth };
  }

  /** With `concurrency_unit: device`, one seat covers every instance on the device. */
  private deviceHoldsSeat(activationId: string, now: Date): boolean {
    return (this.heldByDevice.get(activationId, now.getTime())?.n ?? 0) > 0;
  }

  private seatsTaken(licenseId: string, unit: string, now: Date): number {
    const statement = unit === "device" ? this.seatsByDevice : this.seatsByInstance;
    return statement.get(licenseId, now.getTime())?.n ?? 0;
  }

  /**
   * Whether every seat is taken. Fewer leases marked active (live or expired, one row kept by
   * triggers) than seats means room whatever the unit (a device holds at least one lease): only a
   * license at its limit pays for counting the live ones.
   */
  private seatsFull(licenseId: string, unit: string, limit: number, now: Date): boolean {
    const marked = this.activeLeases.get(licenseId)?.active ?? 0;
    if (marked < limit) return false;
    return this.seatsTaken(licenseId, unit, now) >= limit;
  }
}

/**
 * The lease names its activation inside the signed data: the answer is bound to its request only by
 * the nonce, so without it another activation's lease, taken with an intercepted nonce, would read
 * as a seat held by this device (protocol §14).
 */
function present(
  lease: Pick<LeaseRow, "id" | "activationId" | "instanceId" | "expiresAt">,
  heartbeatIn: number,
): LeaseData {
  return {
    lease_id: lease.id,
    activation_id: lease.activationId,
    instance_id: lease.instanceId,
    expires_at: unixSeconds(lease.expiresAt),
    heartbeat_in: heartbeatIn,
  };
}

const instanceMismatch = () =>
  new ApiError("LEASE_INSTANCE_MISMATCH", "The lease belongs to another instance.");
const expired = () => new ApiError("LEASE_EXPIRED", "The lease expired; acquire a new one.");
