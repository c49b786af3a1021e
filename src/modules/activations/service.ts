import { and, eq } from "drizzle-orm";
import { PREFIX } from "../../crypto/envelope.ts";
import { type PublicKeyInfo, thumbprint } from "../../crypto/keys.ts";
import type { Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import { licenseStatus } from "../../domain/license-state.ts";
import { type DeviceProofHeaders, verifyBodyProof } from "../../http/device-proof.ts";
import { ApiError, type SignedFor } from "../../http/errors.ts";
import type { IdempotencyStore, Outcome } from "../../http/idempotency.ts";
import type { Db } from "../../store/db.ts";
import { preparedInsert } from "../../store/prepared-insert.ts";
import { preparedRowReader } from "../../store/prepared-select.ts";
import { activations, leases, products } from "../../store/schema/index.ts";
import { bindNamedUserActivation, redeemNamedUserToken } from "../email-verifications/tokens.ts";
import type { LicenseRow, LicenseService } from "../licenses/service.ts";
import type { TrustService } from "../trust/service.ts";
import { enqueueActivationEvent } from "../webhooks/enqueue.ts";
import { certificateSubject, issueCertificate } from "./certificate.ts";
import { requireSameKemKey } from "./device-keys.ts";
import type { PolicyWithId, RuntimeCall, RuntimeGate, SignedResult, Target } from "./gate.ts";
import { machineInfoCheck, machineInfoDigest } from "./machine.ts";
import { type ActivationCreateBody, type HeartbeatBody, idempotentPartOf } from "./model.ts";
import { MachineSlots } from "./slots.ts";

export type ActivationRow = typeof activations.$inferSelect;

const HEARTBEAT_JITTER = 0.1;

/**
 * Activation, heartbeat and deactivation: the runtime calls that bind a license to a device key
 * and keep that binding fresh.
 */
export class ActivationService {
  /** The license's machine slots: who holds one, whether a new device may take one. */
  readonly slots: MachineSlots;
  private readonly productById;
  private readonly checkIn;
  private readonly activeOnLicense;
  private readonly insertActivation;

  constructor(
    private readonly deps: Deps,
    private readonly trust: TrustService,
    private readonly licenses: LicenseService,
    private readonly gate: RuntimeGate,
    private readonly idempotency: IdempotencyStore,
    private readonly issuer: string,
  ) {
    this.insertActivation = preparedInsert(deps.sqlite, activations);
    this.activeOnLicense = preparedRowReader<typeof activations, [string, string]>(
      deps.sqlite,
      activations,
      `"license_id" = ? AND "device_thumbprint" = ? AND "status" = 'active'`,
    );
    this.checkIn = deps.sqlite.prepare<
      unknown,
      [number, number, number, string | null, string | null, string]
    >(
      `UPDATE activations SET last_heartbeat_at = ?, last_seen_at = ?, certificate_expires_at = ?,
       app_version = coalesce(?, app_version), sdk_version = coalesce(?, sdk_version) WHERE id = ?`,
    );
    this.productById = preparedRowReader<typeof products, [string]>(deps.sqlite, products, '"id" = ?');
    this.slots = new MachineSlots(deps);
  }

  /**
   * Checks what can be checked before anything is stored: both device keys, the clock, and the
   * activation proof over the body. Runs before idempotency, so a replay needs a valid proof too.
   */
  private verifyActivationRequest(body: ActivationCreateBody, target: Target): PublicKeyInfo {
    const product = this.productById(body.product_id);
    if (!product) throw ApiError.notFound("product");
    Object.assign(target, { environment: product.environment, productId: product.id });
    return verifyBodyProof(body, PREFIX.activationProof, unixSeconds(this.deps.clock.now()));
  }

  /**
   * Activation create, at most once per Idempotency-Key: the proof is checked first (so a replay
   * needs a valid proof too), then the activation runs inside the idempotency transaction. A
   * refusal is recorded after that transaction has rolled back, so the record survives.
   */
  activateOnce(
    body: ActivationCreateBody,
    idempotencyKey: string | undefined,
    call: RuntimeCall,
  ): Promise<Outcome> {
    const target: Target = {};
    return this.gate.observe("activation_create", target, call, () => {
      const deviceKey = this.verifyActivationRequest(body, target);
      const outcome = this.idempotency.execute(
        {
          scope: `device:${thumbprint(deviceKey.text)}`,
          method: "POST",
          route: "/runtime/v1/activations",
          key: idempotencyKey,
          body: idempotentPartOf(body),
          required: true,
        },
        () => ({ status: 201, body: this.activate(body, deviceKey, target) }),
      );
      if (outcome.replayed) this.recheckReplay(body, deviceKey, outcome);
      return outcome;
    });
  }

  /**
   * A replay repeats an earlier answer, but never past a change of fate: a license revoked,
   * expired, suspended or blocked since then gets its denial, an activation deactivated since
   * then gets its signed 410, and a named user's device whose assignment ended since then its
   * signed 403, instead of the stored 201.
   */
  private recheckReplay(body: ActivationCreateBody, deviceKey: PublicKeyInfo, outcome: Outcome): void {
    const license = this.licenses.findByKey(body.license_key);
    if (!license)
      throw new ApiError("LICENSE_KEY_INVALID", "No license with that key exists for this product.");
    const deviceThumbprint = thumbprint(deviceKey.text);
    const signedFor: SignedFor = {
      productId: body.product_id,
      nonce: body.nonce,
      subject: { device_thumbprint: deviceThumbprint },
    };
    const now = this.deps.clock.now();
    this.gate.deny("activate", license, null, deviceThumbprint, now, signedFor);
    const { activation_id: activationId } = outcome.value as { activation_id: string };
    const stored = this.deps.db.select().from(activations).where(eq(activations.id, activationId)).get();
    if (stored?.status !== "active") {
      throw new ApiError(
        "ACTIVATION_DEACTIVATED",
        "This activation was deactivated; activate anew.",
        {},
        { signedFor },
      );
    }
    this.gate.denyUnassigned(this.gate.policyOf(license), stored, signedFor);
  }

  /** `resolved`: a license the caller already holds (trial sign-up) instead of the body's `license_key`. */
  activate(
    body: ActivationCreateBody,
    deviceKey: PublicKeyInfo,
    target: Target,
    resolved?: LicenseRow,
  ): { activation_id: string; certificate: string; machine_info_digest: string } {
    {
      const now = this.deps.clock.now();
      const product = this.productById(body.product_id);
      if (!product) throw ApiError.notFound("product");
      Object.assign(target, { environment: product.environment, productId: product.id });
      if (product.signingStatus !== "ready") this.trust.signingKey(product.id);
      const license = resolved ?? this.licenses.findByKey(body.license_key);
      if (!license || license.productId !== product.id) {
        throw new ApiError("LICENSE_KEY_INVALID", "No license with that key exists for this product.");
      }
      target.licenseId = license.id;
      const policy = this.gate.policyOf(license);
      const deviceThumbprint = thumbprint(deviceKey.text);
      // Inside the idempotency transaction: a refused activation forgets the nonce with it.
      this.gate.rememberActivationNonce(deviceThumbprint, body.nonce, now);
      const signedFor: SignedFor = {
        productId: product.id,
        nonce: body.nonce,
        subject: { device_thumbprint: deviceThumbprint },
      };
      this.gate.deny("activate", license, null, deviceThumbprint, now, signedFor);
      if (policy.validation_mode === "offline" || policy.perpetual_mode === "unmanaged") {
        throw new ApiError(
          "OFFLINE_ACTIVATION_REQUIRED",
          "This license is used only through device-bound offline packages.",
        );
      }
      // Spec §4.2 rule 7: one email-verified token per activation, spent inside this call's
      // transaction so a refused activation leaves it unspent.
      const assignmentId =
        policy.identity_mode === "named_user"
          ? redeemNamedUserToken(
              this.deps,
              this.deps.db,
              body.named_user_token,
              license.id,
              deviceThumbprint,
              now,
            )
          : null;
      const digest = machineInfoDigest(body.machine_info);
      // No savepoint of its own: both callers run this inside the idempotency record's (the key is
      // required), which a refusal below (the slots are full) rolls back, the cull included.
      const decided = ((tx: Db) => {
        const existing = this.activationHoldingSlot(license, policy, deviceThumbprint, now, tx);
        if (existing) {
          requireSameKemKey(existing, body.device_kem_public_key);
          // Activating again is a check-in with the full machine_info: it refreshes the slot,
          // the baseline and the signals sent with it, and takes no second slot.
          const refreshed = {
            machineInfo: body.machine_info,
            machineInfoDigest: digest,
            machineBaselineAt: now,
            machineSignals: body.machine_signals ?? existing.machineSignals,
            lastSeenAt: now,
            lastHeartbeatAt: now,
            appVersion: body.app_version ?? existing.appVersion,
            sdkVersion: body.sdk_version ?? existing.sdkVersion,
          };
          const issued = issueCertificate(
            this.trust,
            this.issuer,
            certificateSubject(license, policy, { ...existing, machineInfoDigest: digest }),
            now,
          );
          tx.update(activations)
            .set({ ...refreshed, certificateExpiresAt: issued.expiresAt })
            .where(eq(activations.id, existing.id))
            .run();
          return { row: { ...existing, ...refreshed }, issued };
        }
        this.slots.requireFree(license, policy, now);
        const row: ActivationRow = {
          id: this.deps.ids.next("activation", now.getTime()),
          environment: license.environment,
          productId: product.id,
          licenseId: license.id,
          status: "active",
          deviceSigningKey: deviceKey.text,
          deviceThumbprint,
          deviceKemKey: body.device_kem_public_key,
          machineInfo: body.machine_info,
          machineInfoDigest: digest,
          machineBaselineAt: now,
          machineSignals: body.machine_signals ?? {},
          appVersion: body.app_version ?? null,
          sdkVersion: body.sdk_version ?? null,
          activatedAt: now,
          lastSeenAt: now,
          lastHeartbeatAt: null,
          certificateExpiresAt: now,
          deactivatedAt: null,
          deactivationReason: null,
          offlineUntil: null,
        };
        // Signed before the row is written, so the row carries its expiry: one write, not two.
        const issued = issueCertificate(
          this.trust,
          this.issuer,
          certificateSubject(license, policy, row),
          now,
        );
        row.certificateExpiresAt = issued.expiresAt;
        this.insertActivation(row);
        enqueueActivationEvent(this.deps, "activation.created", row.id);
        return { row, issued };
      })(this.deps.db);
      const { row: activation, issued } = decided;
      target.activationId = activation.id;
      if (assignmentId) bindNamedUserActivation(this.deps.db, activation.id, assignmentId);
      return {
        activation_id: activation.id,
        certificate: issued.certificate,
        machine_info_digest: activation.machineInfoDigest,
      };
    }
  }

  heartbeat(activationId: string, proof: DeviceProofHeaders, body: HeartbeatBody, call: RuntimeCall) {
    const target: Target = { activationId };
    return this.gate.observe("heartbeat", target, call, () => {
      const { activation, license, policy, now, signedFor } = this.gate.authenticate(
        activationId,
        proof,
        call,
        target,
      );
      this.gate.denyDeviceUse("heartbeat", { activation, license, policy, now, signedFor });
      if (policy.perpetual_mode === "unmanaged" || policy.validation_mode === "offline") {
        throw new ApiError(
          "OFFLINE_ACTIVATION_REQUIRED",
          "This license is used only through offline packages; it takes no heartbeats.",
        );
      }
      const machine = machineInfoCheck(activation, body, policy.fingerprint_profile, now);
      this.cullIfDisplaced(activation, license, policy, now, signedFor);
      const issued = issueCertificate(
        this.trust,
        this.issuer,
        certificateSubject(license, policy, { ...activation, machineInfoDigest: machine.digest }),
        now,
      );
      if (Object.keys(machine.changes).length === 0) {
        // The common check-in, on the hot path: one prepared statement.
        this.checkIn.run(
          now.getTime(),
          now.getTime(),
          issued.expiresAt.getTime(),
          body.app_version ?? null,
          body.sdk_version ?? null,
          activation.id,
        );
      } else {
        this.deps.db
          .update(activations)
          .set({
            lastHeartbeatAt: now,
            lastSeenAt: now,
            certificateExpiresAt: issued.expiresAt,
            appVersion: body.app_version ?? activation.appVersion,
            sdkVersion: body.sdk_version ?? activation.sdkVersion,
            ...machine.changes,
          })
          .where(eq(activations.id, activation.id))
          .run();
      }
      const jitter = 1 + (Math.random() * 2 - 1) * HEARTBEAT_JITTER;
      return {
        data: {
          activation_id: activation.id,
          license_status:
            licenseStatus(license, now) === "suspended" ? ("suspended" as const) : ("active" as const),
          certificate: issued.certificate,
          next_heartbeat_in: Math.max(1, Math.round(policy.heartbeat_sec * jitter)),
          machine_info_digest: machine.digest,
        },
        ...signedFor,
      };
    });
  }

  deactivate(
    activationId: string,
    proof: DeviceProofHeaders,
    call: RuntimeCall,
  ): Promise<SignedResult<string>> {
    const target: Target = { activationId };
    return this.gate.observe("deactivation", target, call, () => {
      const { activation, license, now, signedFor } = this.gate.authenticate(
        activationId,
        proof,
        call,
        target,
      );
      this.gate.deny("deactivate", license, activation, activation.deviceThumbprint, now, signedFor);
      this.end(activation.id, "device", now);
      return { data: "deactivated", ...signedFor };
    });
  }

  /**
   * The device's active activation if it still holds its slot, for a device binding itself again
   * (online activation, an offline package). One silent past its grace while others filled the
   * license has lost it (protocol §13): it is ended as culled and competes as a new device, which
   * on a full license is MACHINE_LIMIT_REACHED, whose rollback takes the cull back with it.
   */
  activationHoldingSlot(
    license: LicenseRow,
    policy: PolicyWithId,
    deviceThumbprint: string,
    now: Date,
    tx: Pick<Db, "update">,
  ): ActivationRow | undefined {
    const existing = this.activeOnLicense(license.id, deviceThumbprint);
    if (!existing || !this.slots.culled(existing, license, policy, now)) return existing;
    this.end(existing.id, "culled", now, tx);
    return undefined;
  }

  /**
   * A stale device whose slot the fresh ones have filled is culled: deactivated with its leases
   * released, and told so with a signed 410. Heartbeats and lease calls both go through this, so
   * a displaced device cannot keep using seats either.
   */
  cullIfDisplaced(
    activation: ActivationRow,
    license: LicenseRow,
    policy: PolicyWithId,
    now: Date,
    signedFor: SignedFor,
  ): void {
    if (!this.slots.culled(activation, license, policy, now)) return;
    this.end(activation.id, "culled", now);
    throw new ApiError(
      "ACTIVATION_DEACTIVATED",
      "This device stopped checking in and its slot was taken.",
      { reason: "culled" },
      { signedFor },
    );
  }

  /** Ends an activation and releases its leases; pass the caller's transaction to join it. */
  end(
    activationId: string,
    reason: "device" | "vendor" | "culled",
    now: Date,
    writer: Pick<Db, "update"> = this.deps.db,
  ): void {
    const run = (tx: Pick<Db, "update">) => {
      tx.update(activations)
        .set({ status: "deactivated", deactivatedAt: now, deactivationReason: reason })
        .where(and(eq(activations.id, activationId), eq(activations.status, "active")))
        .run();
      // A vendor's force-deactivation is announced by its audit event instead.
      if (reason !== "vendor")
        enqueueActivationEvent(this.deps, "activation.deactivated", activationId, { reason });
      tx.update(leases)
        .set({ status: "released", releasedAt: now })
        .where(and(eq(leases.activationId, activationId), eq(leases.status, "active")))
        .run();
    };
    if (writer === this.deps.db) this.deps.db.transaction(run);
    else run(writer);
  }
}
