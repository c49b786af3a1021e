import { type PublicKeyInfo, parsePublicKey } from "../../crypto/keys.ts";
import type { Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import { type RuntimeOperation, runtimeDenial, SIGNED_DENIALS } from "../../domain/runtime-guards.ts";
import type { Environment } from "../../domain/scopes.ts";
import { type DeviceProofHeaders, type DeviceProofVerifier, proofInvalid } from "../../http/device-proof.ts";
import { ApiError, type ErrorCode, type ErrorDetails, type SignedFor } from "../../http/errors.ts";
import type { GroupCommit } from "../../store/group-commit.ts";
import { preparedRowReader } from "../../store/prepared-select.ts";
import { activations, licenses, policies } from "../../store/schema/index.ts";
import type { DeviceBlockService } from "../device-blocks/service.ts";
import { prepareAssignmentCheck } from "../email-verifications/tokens.ts";
import type { LicenseRow } from "../licenses/service.ts";
import { settingsOf } from "../policies/service.ts";
import type { RuntimeEventService, RuntimeOperationName } from "../runtime-events/service.ts";
import type { ActivationRow } from "./service.ts";

export interface RuntimeCall {
  requestId: string;
  method: string;
  pathAndQuery: string;
  rawBody: Uint8Array;
  /** The burst windows' side of the device proof (device-proof routes that went through them). */
  proof?: ProofHooks;
}

/**
 * What the burst windows do as a device proof is checked (runtime-limits.ts). `authenticate` calls
 * them in step with the check, synchronously (in the shared commit's one-at-a-time run where there
 * is one), so calls sent together are asked and charged one by one: the windows hold exactly,
 * whatever is in flight.
 */
export interface ProofHooks {
  /**
   * Before the activation is read and the proof checked: throws RATE_LIMITED while the sender's
   * failing-proof windows are full (asked again only if failures were charged since admission).
   */
  checking(nowMs: number): void;
  /** The proof failed (unknown activation, clock skew, signature, replay): charges those windows. */
  failed(nowMs: number): void;
  /**
   * The proof verified and its nonce is spent: charges the request to its activation's and
   * license's windows, or throws RATE_LIMITED when they are full. Only a verified proof can spend
   * a device's window.
   */
  proven(nowMs: number): void;
}

/** What the controller needs to sign a success: the data, and the product and nonce it answers. */
export interface SignedResult<T> {
  data: T;
  productId: string;
  nonce: string;
}

/** What a rejection is recorded against (spec §6.2); filled in as the request is understood. */
export interface Target {
  environment?: Environment;
  productId?: string | null;
  licenseId?: string | null;
  activationId?: string | null;
}

const DEVICE_KEY_CACHE_LIMIT = 100_000;
const POLICY_CACHE_LIMIT = 10_000;

export type PolicyWithId = ReturnType<typeof settingsOf> & { id: string };

/**
 * What every device-proof call goes through, whatever it asks for: who the device is (proof,
 * clock, nonce), the guards that decide whether it may proceed, and the runtime_events record of
 * a refusal.
 */
export class RuntimeGate {
  private readonly deviceKeys = new Map<string, PublicKeyInfo>();
  /**
   * Policies by id with the revision they were read at. Every change to a policy row raises its
   * revision (policies/service.ts), so one indexed read of that number tells whether the cached
   * settings still hold, whichever process changed them; reading and mapping the whole row was
   * the larger part of a heartbeat's third read. Frozen: callers share the object.
   */
  private readonly policies = new Map<string, { revision: number; policy: PolicyWithId }>();
  private readonly policyRevision;
  /**
   * The hot path's reads, prepared once: building a Drizzle query per request costs several times
   * the read itself (DESIGN §7).
   */
  private readonly byId;
  private assignmentActive?: (activationId: string) => boolean;

  constructor(
    private readonly deps: Deps,
    private readonly blocks: DeviceBlockService,
    private readonly events: RuntimeEventService,
    private readonly proofs: DeviceProofVerifier,
    private readonly commits: GroupCommit,
  ) {
    this.byId = {
      activation: preparedRowReader<typeof activations, [string]>(deps.sqlite, activations, '"id" = ?'),
      license: preparedRowReader<typeof licenses, [string]>(deps.sqlite, licenses, '"id" = ?'),
      policy: preparedRowReader<typeof policies, [string]>(deps.sqlite, policies, '"id" = ?'),
    };
    this.policyRevision = deps.sqlite.prepare<[number], [string]>(
      'SELECT "revision" FROM "policies" WHERE "id" = ?',
    );
  }

  /**
   * A device-proof call: the activation named by the proof (and the path, when there is one),
   * the clock window, the signature, then the nonce. Answers 404 for an unknown activation.
   */
  authenticate(activationId: string | null, proof: DeviceProofHeaders, call: RuntimeCall, target: Target) {
    const now = this.deps.clock.now();
    const nowMs = now.getTime();
    const hooks = call.proof;
    hooks?.checking(nowMs);
    let activation: ActivationRow | undefined;
    try {
      if (activationId !== null && proof.activationId !== activationId)
        throw proofInvalid("activation_mismatch");
      activation = this.byId.activation(proof.activationId);
      if (!activation) throw ApiError.notFound("activation");
      Object.assign(target, {
        environment: activation.environment,
        productId: activation.productId,
        licenseId: activation.licenseId,
        activationId: activation.id,
      });
      this.proofs.verify(
        proof,
        { method: call.method, pathAndQuery: call.pathAndQuery, body: call.rawBody },
        this.deviceKey(activation.deviceSigningKey),
        unixSeconds(now),
      );
    } catch (error) {
      // Charged now, before the next call of the run is checked. Our own failures (not an
      // ApiError) are charged if answered: a batch that fails is run again, and may succeed.
      if (error instanceof ApiError) hooks?.failed(nowMs);
      throw error;
    }
    hooks?.proven(nowMs);
    const license = this.byId.license(activation.licenseId);
    if (!license) throw new Error(`activation ${activation.id} has no license`);
    return {
      activation,
      license,
      policy: this.policyOf(license),
      now,
      signedFor: {
        productId: activation.productId,
        nonce: proof.nonce,
        subject: { activation_id: activation.id },
      } satisfies SignedFor,
    };
  }

  /** Throws the first guard's denial (signed when it is a license-state denial). */
  deny(
    op: RuntimeOperation,
    license: LicenseRow,
    activation: ActivationRow | null,
    deviceThumbprint: string,
    now: Date,
    signedFor: SignedFor,
  ): void {
    const code = this.denial(op, license, activation, deviceThumbprint, now);
    if (!code) return;
    const details = op === "activate" && LICENSE_STATE_DENIALS.has(code) ? { license_id: license.id } : {};
    throw denialError(code, SIGNED_DENIALS.has(code) ? signedFor : undefined, details);
  }

  /** The first guard's denial code, or null; for callers that answer outside the runtime API. */
  denial(
    op: RuntimeOperation,
    license: LicenseRow,
    activation: ActivationRow | null,
    deviceThumbprint: string,
    now: Date,
  ): ErrorCode | null {
    const blocked = this.blocks.blocksOn(license.environment, license.id, deviceThumbprint);
    return runtimeDenial(
      op,
      {
        license: { ...license, blocked: blocked.license },
        activation: { status: activation ? activation.status : "active", deviceBlocked: blocked.device },
      },
      now,
    );
  }

  /**
   * An authenticated device using its license (a check-in, a floating seat, a file key), in the
   * order every such route asks: license state and device blocks, then the named user's
   * assignment.
   */
  denyDeviceUse(
    op: RuntimeOperation,
    use: {
      activation: ActivationRow;
      license: LicenseRow;
      policy: PolicyWithId;
      now: Date;
      signedFor: SignedFor;
    },
  ): void {
    const { activation, license, policy, now, signedFor } = use;
    this.deny(op, license, activation, activation.deviceThumbprint, now, signedFor);
    this.denyUnassigned(policy, activation, signedFor);
  }

  /**
   * Spec §4.2 rules 1 and 3: a named-user activation is refused (signed, like the license-state
   * denials) once its assignment is removed or its user disabled. Device licenses skip the read.
   */
  denyUnassigned(policy: PolicyWithId, activation: ActivationRow, signedFor: SignedFor): void {
    if (policy.identity_mode !== "named_user") return;
    this.assignmentActive ??= prepareAssignmentCheck(this.deps.sqlite);
    if (!this.assignmentActive(activation.id))
      throw denialError("NAMED_USER_ASSIGNMENT_UNAVAILABLE", signedFor);
  }

  policyOf(license: LicenseRow): PolicyWithId {
    const revision = this.policyRevision.values(license.policyId)[0]?.[0];
    const cached = this.policies.get(license.policyId);
    if (cached !== undefined && cached.revision === revision) return cached.policy;
    const row = this.byId.policy(license.policyId);
    if (!row) throw new Error(`license ${license.id} has no policy`);
    const policy = deepFreeze({ ...settingsOf(row), id: row.id });
    if (this.policies.size >= POLICY_CACHE_LIMIT) this.policies.clear();
    this.policies.set(row.id, { revision: row.revision, policy });
    return policy;
  }

  private deviceKey(text: string): PublicKeyInfo {
    let key = this.deviceKeys.get(text);
    if (!key) {
      const parsed = parsePublicKey(text, { vetted: true });
      if (!parsed) throw new Error("a stored device key does not parse");
      if (this.deviceKeys.size >= DEVICE_KEY_CACHE_LIMIT) this.deviceKeys.clear();
      this.deviceKeys.set(text, parsed);
      key = parsed;
    }
    return key;
  }

  /**
   * Runs one runtime operation as one unit of work, and records it in runtime_events if it is
   * refused. The work shares a commit with the other device calls of the same event-loop turn
   * (store/group-commit.ts) and settles only once that commit is done: commits are the largest
   * cost of a heartbeat after the signatures. A refusal commits too, because what was written
   * before it is meant to last: the nonce that was spent, the displaced device that was culled.
   * Writes that must not outlive a refusal use their own (nested) transaction.
   */
  async observe<T>(
    operation: RuntimeOperationName,
    target: Target,
    call: RuntimeCall,
    work: () => T,
  ): Promise<T> {
    try {
      const outcome = await this.commits.run((): { result: T } | { refusal: ApiError } => {
        try {
          return { result: work() };
        } catch (error) {
          if (error instanceof ApiError) return { refusal: error };
          throw error;
        }
      });
      if ("refusal" in outcome) throw outcome.refusal;
      return outcome.result;
    } catch (error) {
      // Spec §6.2: refusals by the rate limits are not rejected requests of the device's own.
      if (error instanceof ApiError && target.environment && error.code !== "RATE_LIMITED") {
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

  /**
   * An activation request's nonce, remembered per device key like a proof's: a captured request
   * sent again (under a new Idempotency-Key) is a replay, not a fresh activation.
   */
  rememberActivationNonce(deviceThumbprint: string, nonce: string, now: Date): void {
    if (!this.proofs.rememberOnce(`device:${deviceThumbprint}`, nonce, unixSeconds(now))) {
      throw proofInvalid("replayed");
    }
  }

  purgeNonces(limit?: number): number {
    return this.proofs.purgeOld(unixSeconds(this.deps.clock.now()), limit);
  }
}

/** The row's own objects, made read-only: a cached policy is shared by every call that reads it. */
function deepFreeze<T>(value: T): T {
  if (typeof value === "object" && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const inner of Object.values(value)) deepFreeze(inner);
  }
  return value;
}

/** A guard's denial as an error; signed only when `signedFor` is given (runtime responses). */
export const denialError = (code: ErrorCode, signedFor?: SignedFor, details: ErrorDetails = {}): ApiError =>
  new ApiError(
    code,
    DENIAL_MESSAGES[code] ?? "This call is not allowed.",
    details,
    signedFor ? { signedFor } : {},
  );

/**
 * Denials about the license itself. Answered to an activation request (create, trial confirm)
 * they also name the license (protocol §16): the device holds no activation to learn it from, and
 * remembers such a denial by license against that license's older offline packages. Nothing is
 * given away: the caller has shown the license key (or the trial's code), and a device learns the
 * id from any activation of it.
 */
const LICENSE_STATE_DENIALS: ReadonlySet<ErrorCode> = new Set([
  "LICENSE_REVOKED",
  "LICENSE_EXPIRED",
  "LICENSE_SUSPENDED",
]);

const DENIAL_MESSAGES: Partial<Record<string, string>> = {
  LICENSE_REVOKED: "The license has been revoked.",
  LICENSE_EXPIRED: "The license has expired.",
  LICENSE_SUSPENDED: "The license is suspended.",
  LICENSE_BLOCKED: "The vendor blocked this license.",
  DEVICE_BLOCKED: "The vendor blocked this device.",
  ACTIVATION_DEACTIVATED: "This activation was deactivated.",
  NAMED_USER_ASSIGNMENT_UNAVAILABLE: "The named user is no longer assigned to this license.",
};
