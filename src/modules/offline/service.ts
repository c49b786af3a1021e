import { eq } from "drizzle-orm";
import { sha256Hex } from "../../crypto/encoding.ts";
import { thumbprint } from "../../crypto/keys.ts";
import { buildOfflinePackage } from "../../crypto/offline-package.ts";
import type { ChangeContext, Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import { ApiError, FieldErrorCollector } from "../../http/errors.ts";
import type { Db } from "../../store/db.ts";
import { activations, offlinePackages } from "../../store/schema/index.ts";
import { issueCertificate } from "../activations/certificate.ts";
import { requireSameKemKey } from "../activations/device-keys.ts";
import { denialError, type PolicyWithId, type RuntimeGate } from "../activations/gate.ts";
import { machineInfoDigest } from "../activations/machine.ts";
import type { ActivationRow, ActivationService } from "../activations/service.ts";
import { recordAudit } from "../events/service.ts";
import type { LicenseRow, LicenseService } from "../licenses/service.ts";
import type { TrustService } from "../trust/service.ts";
import { enqueueActivationEvent } from "../webhooks/enqueue.ts";
import type { OfflineCertificateBody } from "./model.ts";
import { earlierPackage, type IssuedPackage, packageCap, replayEarlier } from "./replay.ts";
import { checkFreshness, requestedExpiry, type VerifiedRequest, verifyOfflineRequest } from "./request.ts";

/** Spec §4.2 rules 2 and 5 and DESIGN §4: offline use is for these policies only. */
export const allowsOffline = (policy: Pick<PolicyWithId, "validation_mode" | "perpetual_mode">): boolean =>
  policy.validation_mode === "offline" ||
  policy.validation_mode === "hybrid" ||
  policy.perpetual_mode === "unmanaged";

/**
 * Offline packages (DESIGN §5, spec §4.3): a device's signed request in, a signed, device-bound
 * ZIP out. The API route and the air-gapped command both call `issue`, so both make the same
 * package and the same audit record.
 */
export class OfflinePackageService {
  constructor(
    private readonly deps: Deps,
    private readonly trust: TrustService,
    private readonly licenses: LicenseService,
    private readonly gate: RuntimeGate,
    private readonly activationService: ActivationService,
    private readonly plan: () => PlanDefinition,
    private readonly issuer: string,
  ) {}

  /**
   * One write transaction from the first read to the last write: the command line and a server
   * (or two servers) share the store, so a revoke, suspension, shortened expiry, policy change or
   * archived product committed by another process is either seen by every check here or waits
   * for this package. Nothing is decided from a row read before the lock.
   */
  issue(licenseId: string, body: OfflineCertificateBody, ctx: ChangeContext): IssuedPackage {
    return this.deps.db.transaction((tx) => this.issueLocked(tx, licenseId, body, ctx), {
      behavior: "immediate",
    });
  }

  private issueLocked(
    tx: Pick<Db, "insert" | "update">,
    licenseId: string,
    body: OfflineCertificateBody,
    ctx: ChangeContext,
  ): IssuedPackage {
    const now = this.deps.clock.now();
    const license = this.licenses.get(licenseId, ctx.environment);
    this.licenses.assertProductActive(license);
    const plan = this.plan();
    if (!hasFeature(plan, "offline_packages")) {
      throw new ApiError(
        "PLAN_ENTITLEMENT_REQUIRED",
        "The workspace plan does not include offline packages.",
        {
          entitlement: "offline_packages",
        },
      );
    }
    const errors = new FieldErrorCollector();
    const request = verifyOfflineRequest(body.request, license.productId, errors);
    const asked = requestedExpiry(body, errors);
    if (body.license_assignment_id !== undefined && body.license_assignment_id !== null)
      errors.add(
        "license_assignment_id",
        "is only for named-user licenses, which take no offline packages yet",
      );
    errors.throwIfAny();
    if (!request) throw new Error("unreachable: a failed request check adds a field error");

    const deviceThumbprint = thumbprint(request.signingKey.text);
    // The runtime's license guards, answered unsigned: this is the vendor's API, not a device's.
    const denied = this.gate.denial("offline_package", license, null, deviceThumbprint, now);
    if (denied) throw denialError(denied);
    const policy = this.gate.policyOf(license);
    if (!allowsOffline(policy)) {
      throw new ApiError(
        "OFFLINE_PACKAGE_NOT_ALLOWED",
        "The license's policy is online only; offline packages need validation_mode offline or hybrid, or perpetual_mode unmanaged.",
        { validation_mode: policy.validation_mode, perpetual_mode: policy.perpetual_mode },
      );
    }
    if (policy.identity_mode === "named_user") {
      throw new ApiError(
        "OFFLINE_PACKAGE_NOT_ALLOWED",
        "Named-user licenses take no offline packages yet: they need a license assignment.",
        { identity_mode: "named_user" },
      );
    }

    const earlier = earlierPackage(this.deps.db, license.id, request);
    if (earlier)
      return replayEarlier(this.deps.db, this.trust, earlier, { license, policy, plan, asked, now });

    const fresh = new FieldErrorCollector();
    checkFreshness(body.request.generated_at, unixSeconds(now), fresh);
    // Whole seconds, as the manifest and certificate state it: the device's slot (offline_until)
    // must end when the package says it does, not up to a second later.
    const expiresAt = new Date(unixSeconds(this.packageExpiry(license, asked, now, plan, fresh)) * 1000);
    fresh.throwIfAny();
    return this.create(tx, license, policy, body, request, { asked, expiresAt, now }, ctx);
  }

  /** As asked (within the license), else the license's expiry, else the plan's longest license. */
  private packageExpiry(
    license: LicenseRow,
    asked: Date | undefined,
    now: Date,
    plan: PlanDefinition,
    errors: FieldErrorCollector,
  ): Date {
    const cap = packageCap(license, now, plan);
    if (asked === undefined) return cap;
    // Whole seconds, as the package states its expiry: one within the current second would be
    // issued already expired (the SDK refuses a package whose expires_at is its issued_at).
    if (unixSeconds(asked) <= unixSeconds(now)) errors.add("expires_at", "must be in the future");
    else if (asked.getTime() > cap.getTime())
      errors.add(
        "expires_at",
        license.expiresAt && license.expiresAt.getTime() === cap.getTime()
          ? "must not be after the license's expires_at"
          : `is beyond the plan's license_duration_max_sec (${plan.license_duration_max_sec}s from now)`,
      );
    return asked;
  }

  private create(
    tx: Pick<Db, "insert" | "update">,
    license: LicenseRow,
    policy: PolicyWithId,
    body: OfflineCertificateBody,
    request: VerifiedRequest,
    times: { asked: Date | undefined; expiresAt: Date; now: Date },
    ctx: ChangeContext,
  ): IssuedPackage {
    const { now, expiresAt } = times;
    const deviceThumbprint = thumbprint(request.signingKey.text);
    const digest = machineInfoDigest(body.request.machine_info);
    const id = this.deps.ids.next("offlinePackage", now.getTime());
    // Read under the lock (issue's transaction), so the package, its certificate and the key a
    // rotation's retention counts it under are the same one (the certificate's signer reads the
    // refreshed memo).
    const signing = this.trust.committedSigningKey(license.productId);
    const activation = this.bindDevice(tx, license, policy, body, request, digest, expiresAt, now);
    const exp = unixSeconds(expiresAt);
    const { certificate } = issueCertificate(
      this.trust,
      this.issuer,
      {
        license,
        policy,
        activationId: activation.id,
        deviceThumbprint,
        machineInfoDigest: digest,
      },
      now,
      { offlineUntil: exp },
    );
    const built = buildOfflinePackage(
      {
        manifest: {
          product_id: license.productId,
          license_id: license.id,
          assignment_id: null,
          device_signing_key_thumbprint: deviceThumbprint,
          device_kem_key_thumbprint: thumbprint(request.kemKey.text),
          issued_at: unixSeconds(now),
          expires_at: exp,
        },
        licenseJwt: certificate,
        trustBundle: this.trust.bundle(license.productId),
      },
      signing.privateKey,
    );
    const packageSha256 = sha256Hex(built.bytes);
    tx.insert(offlinePackages)
      .values({
        id,
        environment: license.environment,
        productId: license.productId,
        licenseId: license.id,
        activationId: activation.id,
        requestSha256: request.identity,
        requestedExpiresAt: times.asked ?? null,
        assignmentId: null,
        signingKeyId: signing.keyId,
        issuedAt: now,
        expiresAt,
        packageSha256,
        body: Buffer.from(built.bytes),
      })
      .run();
    recordAudit(
      tx,
      this.deps,
      { ...ctx, environment: license.environment },
      {
        type: "license.offline_package_issued",
        target: { type: "license", id: license.id },
        data: {
          package_id: id,
          activation_id: activation.id,
          device_signing_key_thumbprint: deviceThumbprint,
          expires_at: expiresAt.toISOString(),
          package_sha256: packageSha256,
        },
      },
    );
    return { id, bytes: built.bytes, replayed: false };
  }

  /**
   * The device's activation: its existing active one (a device that also activated online, or got
   * an earlier package), or a new one that takes a machine slot. A package keeps the slot held
   * until it expires, since the device cannot check in.
   */
  private bindDevice(
    tx: Pick<Db, "update">,
    license: LicenseRow,
    policy: PolicyWithId,
    body: OfflineCertificateBody,
    request: VerifiedRequest,
    digest: string,
    expiresAt: Date,
    now: Date,
  ): ActivationRow {
    const deviceThumbprint = thumbprint(request.signingKey.text);
    // A displaced device competes as a new device, as online activation has it: reusing its
    // activation would hand it a package, and offline_until would then shield it from culling.
    const existing = this.activationService.activationHoldingSlot(license, policy, deviceThumbprint, now, tx);
    if (existing) {
      requireSameKemKey(existing, request.kemKey.text);
      const offlineUntil =
        existing.offlineUntil && existing.offlineUntil > expiresAt ? existing.offlineUntil : expiresAt;
      const changes = { offlineUntil, lastSeenAt: now, certificateExpiresAt: expiresAt };
      this.deps.db.update(activations).set(changes).where(eq(activations.id, existing.id)).run();
      return { ...existing, ...changes };
    }
    this.activationService.slots.requireFree(license, policy, now);
    const row: ActivationRow = {
      id: this.deps.ids.next("activation", now.getTime()),
      environment: license.environment,
      productId: license.productId,
      licenseId: license.id,
      status: "active",
      deviceSigningKey: request.signingKey.text,
      deviceThumbprint,
      deviceKemKey: request.kemKey.text,
      machineInfo: body.request.machine_info,
      machineInfoDigest: digest,
      machineBaselineAt: now,
      machineSignals: {},
      appVersion: null,
      sdkVersion: null,
      activatedAt: now,
      lastSeenAt: now,
      lastHeartbeatAt: null,
      certificateExpiresAt: expiresAt,
      deactivatedAt: null,
      deactivationReason: null,
      offlineUntil: expiresAt,
    };
    this.deps.db.insert(activations).values(row).run();
    enqueueActivationEvent(this.deps, "activation.created", row.id);
    return row;
  }
}
