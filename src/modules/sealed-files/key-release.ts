import { b64u } from "../../crypto/encoding.ts";
import { hpkeOpen, hpkeSeal } from "../../crypto/hpke.ts";
import { parsePublicKey } from "../../crypto/keys.ts";
import { headerSha256, parseSealedHeader, SEALED_INFO, sealedCore } from "../../crypto/sealed-file.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import type { DeviceProofHeaders } from "../../http/device-proof.ts";
import { ApiError } from "../../http/errors.ts";
import type { RuntimeCall, RuntimeGate, SignedResult, Target } from "../activations/gate.ts";
import type { ActivationService } from "../activations/service.ts";
import type { SealedFileKeyBody } from "./model.ts";
import { planLacksSealedFiles, type SealedFileService, sealedFilesUnavailable } from "./service.ts";

export type SealedFileInvalidReason =
  | "invalid_header"
  | "wrong_product"
  | "unknown_key"
  | "retired_key"
  | "compromised_key"
  | "unwrap_failed"
  | "device_kem_key_invalid";

const invalid = (reason: SealedFileInvalidReason, message: string, extra: Record<string, unknown> = {}) =>
  new ApiError("SEALED_FILE_INVALID", message, { reason, ...extra });

export interface SealedFileKey {
  activation_id: string;
  file_id: string;
  header_sha256: string;
  enc: string;
  wrapped_key: string;
}

/**
 * `POST /runtime/v1/activations/{id}/sealed-file-keys` (spec §4.2 rules 3-4): opens a file's
 * data key with the product sealing key and seals it again to this activation's KEM key. The
 * device proof and the license guards are the runtime gate's; a refusal is deliberately not
 * recorded in runtime_events (spec §6.2), so the gate's `observe` is not used here.
 */
export class SealedFileKeyService {
  constructor(
    private readonly gate: RuntimeGate,
    private readonly slots: Pick<ActivationService, "cullIfDisplaced">,
    private readonly sealed: SealedFileService,
    private readonly plan: () => PlanDefinition,
  ) {}

  async release(
    activationId: string,
    proof: DeviceProofHeaders,
    body: SealedFileKeyBody,
    call: RuntimeCall,
  ): Promise<SignedResult<SealedFileKey>> {
    const unrecorded: Target = {};
    const { activation, license, policy, now, signedFor } = this.gate.authenticate(
      activationId,
      proof,
      call,
      unrecorded,
    );
    // License state first (revoked, expired, blocked, deactivated, suspended), then the plan.
    this.gate.denyDeviceUse("sealed_file_key", { activation, license, policy, now, signedFor });
    // A device whose slot fresher ones have taken opens no more files, as it takes no more seats:
    // otherwise max_machines would not bound the devices that can read a sealed file.
    this.slots.cullIfDisplaced(activation, license, policy, now, signedFor);
    if (!hasFeature(this.plan(), "sealed_files")) throw planLacksSealedFiles();
    if (!this.sealed.offered(activation.environment)) throw sealedFilesUnavailable(activation.environment);

    const parsed = parseSealedHeader(body.header);
    if (!parsed.ok) {
      throw invalid(
        "invalid_header",
        `The sealed-file header is invalid: ${parsed.field} ${parsed.problem}.`,
        {
          field: parsed.field,
        },
      );
    }
    const header = parsed.header;
    if (header.product_id !== activation.productId)
      throw invalid("wrong_product", "The file was sealed for another product.");
    const key = this.sealed.keyRow(header.key_id);
    if (!key || key.productId !== activation.productId)
      throw invalid("unknown_key", "The file was sealed with a key this product does not have.");
    // Any active key releases, the current one and those it replaced; the row is read on every
    // call, so a key retired from the command line is refused from its next request on.
    if (key.status !== "active") {
      this.sealed.forget(key);
      if (key.status === "retired") throw invalid("retired_key", "The file's sealing key was retired.");
      throw invalid("compromised_key", "The file's sealing key is compromised.");
    }

    const core = sealedCore(header);
    let dek: Uint8Array;
    try {
      dek = await hpkeOpen(
        this.sealed.privateScalar(key.keyId),
        b64u.decode(header.enc),
        b64u.decode(header.wrapped_key),
        SEALED_INFO.product,
        core,
      );
    } catch (error) {
      if (error instanceof ApiError) throw error;
      // A changed byte anywhere in the core, enc or wrapped key lands here.
      throw invalid(
        "unwrap_failed",
        "The file's data key cannot be opened; the header was altered or damaged.",
      );
    }
    if (dek.length !== 32) throw invalid("unwrap_failed", "The file's data key has the wrong length.");

    if (header.entitlement !== undefined) {
      const entitlements: Record<string, unknown> = { ...policy.entitlements, ...license.entitlements };
      if (entitlements[header.entitlement] !== true) {
        throw new ApiError(
          "SEALED_FILE_ENTITLEMENT_REQUIRED",
          `The file needs the entitlement ${header.entitlement}, which this license does not have.`,
          { entitlement: header.entitlement },
        );
      }
    }
    const kem = parsePublicKey(activation.deviceKemKey);
    if (kem?.alg !== "p256")
      throw invalid("device_kem_key_invalid", "This activation's KEM key is not a P-256 key.");
    const wrapped = await hpkeSeal(
      b64u.decode(activation.deviceKemKey.slice("p256:".length)),
      dek,
      SEALED_INFO.device,
      `${core}\n${activation.id}`,
    );
    dek.fill(0);
    return {
      data: {
        activation_id: activation.id,
        file_id: header.file_id,
        header_sha256: headerSha256(body.header),
        enc: b64u.encode(wrapped.enc),
        wrapped_key: b64u.encode(wrapped.ciphertext),
      },
      ...signedFor,
    };
  }
}
