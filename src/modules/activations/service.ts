import { and, eq } from "drizzle-orm";
import { PREFIX } from "../../crypto/envelope.ts";
import { canonicalize } from "../../crypto/jcs.ts";
import { type PublicKeyInfo, parsePublicKey, thumbprint, verifySignature } from "../../crypto/keys.ts";
import type { Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import { licenseStatus } from "../../domain/license-state.ts";
import { type RuntimeOperation, runtimeDenial, SIGNED_DENIALS } from "../../domain/runtime-guards.ts";
import type { Environment } from "../../domain/scopes.ts";
import {
  CLOCK_SKEW_SEC,
  type DeviceProofHeaders,
  type DeviceProofVerifier,
  proofInvalid,
} from "../../http/device-proof.ts";
import { ApiError } from "../../http/errors.ts";
import type { Db } from "../../store/db.ts";
import { activations, leases, licenses, policies, products } from "../../store/schema/index.ts";
import type { DeviceBlockService } from "../device-blocks/service.ts";
import type { LicenseRow, LicenseService } from "../licenses/service.ts";
import { settingsOf } from "../policies/service.ts";
import type { RuntimeEventService, RuntimeOperationName } from "../runtime-events/service.ts";
import type { TrustService } from "../trust/service.ts";
import { issueCertificate } from "./certificate.ts";
import { machineInfoCheck, machineInfoDigest } from "./machine.ts";
import type { ActivationCreateBody, HeartbeatBody } from "./model.ts";

export type ActivationRow = typeof activations.$inferSelect;
type PolicyWithId = ReturnType<typeof settingsOf> & { id: string };

export interface RuntimeCall {
  requestId: string;
  method: string;
  pathAndQuery: string;
  rawBody: Uint8Array;
}

/** What the controller needs to sign a success: the data, and the product and nonce it answers. */
export interface SignedResult<T> {
  data: T;
  productId: string;
  nonce: string;
}

/** What a rejection is recorded against (spec §6.2); filled in as the request is understood. */
interface Target {
  environment?: Environment;
  productId?: string | null;
  licenseId?: string | null;
  activationId?: string | null;
}

const DEVICE_KEY_CACHE_LIMIT = 100_000;
const HEARTBEAT_JITTER = 0.1;

/**
 * Activation, heartbeat and deactivation: the runtime calls that bind a license to a device key
 * and keep that binding fresh.
 */
export class ActivationService {
  private readonly deviceKeys = new Map<string, PublicKeyInfo>();
  private readonly countSlots;

  constructor(
    private readonly deps: Deps,
    private readonly trust: TrustService,
    private readonly licenses: LicenseService,
    private readonly blocks: DeviceBlockService,
    private readonly events: RuntimeEventService,
    private readonly proofs: DeviceProofVerifier,
    private readonly issuer: string,
  ) {
    this.countSlots = deps.sqlite.prepare<{ n: number }, [string, number, number]>(
      `SELECT count(*) AS n FROM activations WHERE license_id = ? AND status = 'active'
       AND (? = 0 OR coalesce(last_heartbeat_at, activated_at) >= ?)`,
    );
  }

  /**
   * Checks what can be checked before anything is stored: both device keys, the clock, and the
   * activation proof over the body. Runs before idempotency, so a replay needs a valid proof too.
   */
  verifyActivationRequest(body: ActivationCreateBody, call: RuntimeCall): PublicKeyInfo {
    const target: Target = {};
    return this.observe("activation_create", target, call, () => {
      const product = this.deps.db.select().from(products).where(eq(products.id, body.product_id)).get();
      if (!product) throw ApiError.notFound("product");
      Object.assign(target, { environment: product.environment, productId: product.id });
      const signingKey = parsePublicKey(body.device_signing_public_key);
      const kemKey = parsePublicKey(body.device_kem_public_key);
      const errors: Record<string, string[]> = {};
      if (!signingKey)
        errors.device_signing_public_key = ["must be ed25519:<b64u 32 bytes> or p256:<b64u 65-byte point>"];
      if (kemKey?.alg !== "p256")
        errors.device_kem_public_key = ["must be p256:<b64u 65-byte uncompressed point>"];
      if (!signingKey || kemKey?.alg !== "p256") throw ApiError.validation(errors);
      const nowSec = unixSeconds(this.deps.clock.now());
      if (Math.abs(nowSec - body.client_time) > CLOCK_SKEW_SEC) {
        throw new ApiError(
          "CLOCK_SKEW",
          "The device clock differs from the server clock by more than 300 seconds.",
          {
            server_time: nowSec,
          },
        );
      }
      const { device_proof, ...signedPart } = body;
      if (!verifySignature(signingKey, PREFIX.activationProof + canonicalize(signedPart), device_proof)) {
        throw proofInvalid("invalid_signature");
      }
      return signingKey;
    });
  }

  activate(
    body: ActivationCreateBody,
    deviceKey: PublicKeyInfo,
    call: RuntimeCall,
  ): SignedResult<{
    activation_id: string;
    certificate: string;
    machine_info_digest: string;
  }> {
    const target: Target = {};
    return this.observe("activation_create", target, call, () => {
      const now = this.deps.clock.now();
      const product = this.deps.db.select().from(products).where(eq(products.id, body.product_id)).get();
      if (!product) throw ApiError.notFound("product");
      Object.assign(target, { environment: product.environment, productId: product.id });
      if (product.signingStatus !== "ready") this.trust.signingKey(product.id);
      const license = this.licenses.findByKey(body.license_key);
      if (!license || license.productId !== product.id) {
        throw new ApiError("LICENSE_KEY_INVALID", "No license with that key exists for this product.");
      }
      target.licenseId = license.id;
      const policy = this.policyOf(license);
      const deviceThumbprint = thumbprint(deviceKey.text);
      const signedFor = { productId: product.id, nonce: body.nonce };
      this.deny("activate", license, null, deviceThumbprint, now, signedFor);
      if (policy.validation_mode === "offline" || policy.perpetual_mode === "unmanaged") {
        throw new ApiError(
          "OFFLINE_ACTIVATION_REQUIRED",
          "This license is used only through device-bound offline packages.",
        );
      }
      if (policy.identity_mode === "named_user") {
        // Named-user tokens come from email verification; none is accepted until that exists.
        throw new ApiError(
          "NAMED_USER_TOKEN_INVALID",
          "This license needs a named_user_token from email verification.",
        );
      }
      const digest = machineInfoDigest(body.machine_info);
      const activation = this.deps.db.transaction(
        (tx) => {
          const existing = tx
            .select()
            .from(activations)
            .where(
              and(
                eq(activations.licenseId, license.id),
                eq(activations.deviceThumbprint, deviceThumbprint),
                eq(activations.status, "active"),
              ),
            )
            .get();
          if (existing) return existing;
          const maxMachines = license.maxMachinesOverride ?? policy.max_machines;
          if (this.slotsInUse(license.id, policy, now) >= maxMachines) {
            throw new ApiError("MACHINE_LIMIT_REACHED", "Every machine slot of this license is in use.", {
              max_machines: maxMachines,
            });
          }
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
          };
          tx.insert(activations).values(row).run();
          return row;
        },
        { behavior: "immediate" },
      );
      target.activationId = activation.id;
      const issued = issueCertificate(
        this.trust,
        this.issuer,
        this.subject(license, policy, activation),
        now,
      );
      this.deps.db
        .update(activations)
        .set({ certificateExpiresAt: issued.expiresAt })
        .where(eq(activations.id, activation.id))
        .run();
      return {
        data: {
          activation_id: activation.id,
          certificate: issued.certificate,
          machine_info_digest: activation.machineInfoDigest,
        },
        ...signedFor,
      };
    });
  }

  heartbeat(activationId: string, proof: DeviceProofHeaders, body: HeartbeatBody, call: RuntimeCall) {
    const target: Target = { activationId };
    return this.observe("heartbeat", target, call, () => {
      const { activation, license, policy, now, signedFor } = this.authenticate(
        activationId,
        proof,
        call,
        target,
      );
      this.deny("heartbeat", license, activation, activation.deviceThumbprint, now, signedFor);
      if (policy.perpetual_mode === "unmanaged" || policy.validation_mode === "offline") {
        throw new ApiError(
          "OFFLINE_ACTIVATION_REQUIRED",
          "This license is used only through offline packages; it takes no heartbeats.",
        );
      }
      const machine = machineInfoCheck(activation, body, policy.fingerprint_profile, now);
      if (this.culled(activation, license, policy, now)) {
        this.deps.db
          .update(activations)
          .set({ status: "deactivated", deactivatedAt: now, deactivationReason: "culled" })
          .where(eq(activations.id, activation.id))
          .run();
        throw new ApiError(
          "ACTIVATION_DEACTIVATED",
          "This device stopped checking in and its slot was taken.",
          { reason: "culled" },
          { signedFor },
        );
      }
      const issued = issueCertificate(
        this.trust,
        this.issuer,
        this.subject(license, policy, { ...activation, machineInfoDigest: machine.digest }),
        now,
      );
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

  deactivate(activationId: string, proof: DeviceProofHeaders, call: RuntimeCall): SignedResult<string> {
    const target: Target = { activationId };
    return this.observe("deactivation", target, call, () => {
      const { activation, license, now, signedFor } = this.authenticate(activationId, proof, call, target);
      this.deny("deactivate", license, activation, activation.deviceThumbprint, now, signedFor);
      this.end(activation.id, "device", now);
      return { data: "deactivated", ...signedFor };
    });
  }

  purgeNonces(): number {
    return this.proofs.purgeOld(unixSeconds(this.deps.clock.now()));
  }

  /** Ends an activation and releases its leases; pass the caller's transaction to join it. */
  end(
    activationId: string,
    reason: "device" | "vendor",
    now: Date,
    writer: Pick<Db, "update"> = this.deps.db,
  ): void {
    const run = (tx: Pick<Db, "update">) => {
      tx.update(activations)
        .set({ status: "deactivated", deactivatedAt: now, deactivationReason: reason })
        .where(and(eq(activations.id, activationId), eq(activations.status, "active")))
        .run();
      tx.update(leases)
        .set({ status: "released", releasedAt: now })
        .where(and(eq(leases.activationId, activationId), eq(leases.status, "active")))
        .run();
    };
    if (writer === this.deps.db) this.deps.db.transaction(run);
    else run(writer);
  }

  /**
   * A device-proof call: the activation named by the proof (and the path, when there is one),
   * the clock window, the signature, then the nonce. Answers 404 for an unknown activation.
   */
  authenticate(activationId: string | null, proof: DeviceProofHeaders, call: RuntimeCall, target: Target) {
    if (activationId !== null && proof.activationId !== activationId)
      throw proofInvalid("activation_mismatch");
    const activation = this.deps.db
      .select()
      .from(activations)
      .where(eq(activations.id, proof.activationId))
      .get();
    if (!activation) throw ApiError.notFound("activation");
    Object.assign(target, {
      environment: activation.environment,
      productId: activation.productId,
      licenseId: activation.licenseId,
      activationId: activation.id,
    });
    const now = this.deps.clock.now();
    this.proofs.verify(
      proof,
      { method: call.method, pathAndQuery: call.pathAndQuery, body: call.rawBody },
      this.deviceKey(activation.deviceSigningKey),
      unixSeconds(now),
    );
    const license = this.deps.db.select().from(licenses).where(eq(licenses.id, activation.licenseId)).get();
    if (!license) throw new Error(`activation ${activation.id} has no license`);
    return {
      activation,
      license,
      policy: this.policyOf(license),
      now,
      signedFor: { productId: activation.productId, nonce: proof.nonce },
    };
  }

  /** Throws the first guard's denial (signed when it is a license-state denial). */
  deny(
    op: RuntimeOperation,
    license: LicenseRow,
    activation: ActivationRow | null,
    deviceThumbprint: string,
    now: Date,
    signedFor: { productId: string; nonce: string },
  ): void {
    const code = runtimeDenial(
      op,
      {
        license: { ...license, blocked: this.blocks.isBlocked(license.environment, "license", license.id) },
        activation: activation
          ? {
              status: activation.status,
              deviceBlocked: this.blocks.isBlocked(license.environment, "device_key", deviceThumbprint),
            }
          : {
              status: "active",
              deviceBlocked: this.blocks.isBlocked(license.environment, "device_key", deviceThumbprint),
            },
      },
      now,
    );
    if (!code) return;
    throw new ApiError(
      code,
      DENIAL_MESSAGES[code] ?? "This call is not allowed.",
      {},
      SIGNED_DENIALS.has(code) ? { signedFor } : {},
    );
  }

  policyOf(license: LicenseRow): PolicyWithId {
    const policy = this.deps.db.select().from(policies).where(eq(policies.id, license.policyId)).get();
    if (!policy) throw new Error(`license ${license.id} has no policy`);
    return { ...settingsOf(policy), id: policy.id };
  }

  /**
   * Slots held on a license. For policies that require heartbeats, a device stops holding its
   * slot once heartbeat_sec + network_grace_sec have passed since it last checked in.
   */
  private slotsInUse(licenseId: string, policy: PolicyWithId, now: Date): number {
    const freshSince = policy.heartbeat_required
      ? now.getTime() - (policy.heartbeat_sec + policy.network_grace_sec) * 1000
      : 0;
    return this.countSlots.get(licenseId, policy.heartbeat_required ? 1 : 0, freshSince)?.n ?? 0;
  }

  /** A stale device coming back finds its slot taken when the fresh ones already fill the license. */
  private culled(activation: ActivationRow, license: LicenseRow, policy: PolicyWithId, now: Date): boolean {
    if (!policy.heartbeat_required) return false;
    const lastSeen = (activation.lastHeartbeatAt ?? activation.activatedAt).getTime();
    if (lastSeen >= now.getTime() - (policy.heartbeat_sec + policy.network_grace_sec) * 1000) return false;
    return this.slotsInUse(license.id, policy, now) >= (license.maxMachinesOverride ?? policy.max_machines);
  }

  private subject(
    license: LicenseRow,
    policy: PolicyWithId,
    activation: Pick<ActivationRow, "id" | "deviceThumbprint" | "machineInfoDigest">,
  ) {
    return {
      license,
      policy,
      activationId: activation.id,
      deviceThumbprint: activation.deviceThumbprint,
      machineInfoDigest: activation.machineInfoDigest,
    };
  }

  private deviceKey(text: string): PublicKeyInfo {
    let key = this.deviceKeys.get(text);
    if (!key) {
      const parsed = parsePublicKey(text);
      if (!parsed) throw new Error("a stored device key does not parse");
      if (this.deviceKeys.size >= DEVICE_KEY_CACHE_LIMIT) this.deviceKeys.clear();
      this.deviceKeys.set(text, parsed);
      key = parsed;
    }
    return key;
  }

  /** Runs one runtime operation and records it in runtime_events if it is refused. */
  observe<T>(operation: RuntimeOperationName, target: Target, call: RuntimeCall, work: () => T): T {
    try {
      return work();
    } catch (error) {
      if (error instanceof ApiError && target.environment) {
        this.events.record({
          environment: target.environment,
          operation,
          code: error.code,
          httpStatus: error.status,
          productId: target.productId ?? null,
          licenseId: target.licenseId ?? null,
          activationId: target.activationId ?? null,
          requestId: call.requestId,
        });
      }
      throw error;
    }
  }
}

const DENIAL_MESSAGES: Partial<Record<string, string>> = {
  LICENSE_REVOKED: "The license has been revoked.",
  LICENSE_EXPIRED: "The license has expired.",
  LICENSE_SUSPENDED: "The license is suspended.",
  LICENSE_BLOCKED: "The vendor blocked this license.",
  DEVICE_BLOCKED: "The vendor blocked this device.",
  ACTIVATION_DEACTIVATED: "This activation was deactivated.",
};

/** What idempotency compares: a retry carries a fresh nonce, proof and clock reading, and is otherwise the same. */
export function idempotentPartOf(body: ActivationCreateBody) {
  const { nonce: _nonce, device_proof: _proof, client_time: _time, request_id: _request, ...rest } = body;
  return rest;
}
