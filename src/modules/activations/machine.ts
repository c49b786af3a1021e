import { sha256Hex } from "../../crypto/encoding.ts";
import { canonicalize } from "../../crypto/jcs.ts";
import { FINGERPRINT_PROFILE_DETAILS, type PolicySettings } from "../../domain/policy-rules.ts";
import { ApiError } from "../../http/errors.ts";
import type { HeartbeatBody } from "./model.ts";

export const machineInfoDigest = (info: Record<string, unknown>): string => sha256Hex(canonicalize(info));

interface Baseline {
  machineInfoDigest: string;
  machineBaselineAt: Date;
}

/**
 * Spec §4.2 rule 2: a heartbeat normally sends only the digest; the full machine_info is required
 * when the digest changed (except under the relaxed profile), when none was sent, or when the
 * last full baseline is older than the profile allows (24 h; 1 h for strict).
 */
export function machineInfoCheck(
  activation: Baseline,
  body: HeartbeatBody,
  profile: PolicySettings["fingerprint_profile"],
  now: Date,
): {
  digest: string;
  changes: { machineInfo?: Record<string, unknown>; machineInfoDigest?: string; machineBaselineAt?: Date };
} {
  if (body.machine_info) {
    const digest = machineInfoDigest(body.machine_info);
    return {
      digest,
      changes: { machineInfo: body.machine_info, machineInfoDigest: digest, machineBaselineAt: now },
    };
  }
  const details = FINGERPRINT_PROFILE_DETAILS[profile];
  const required = (reason: string) =>
    new ApiError("MACHINE_INFO_REQUIRED", "Send the full machine_info with this heartbeat.", { reason });
  if (!body.machine_info_digest) throw required("missing");
  if (now.getTime() - activation.machineBaselineAt.getTime() > details.baseline_max_age_sec * 1000) {
    throw required("baseline_stale");
  }
  if (body.machine_info_digest !== activation.machineInfoDigest) {
    if (details.on_machine_change !== "accept") throw required("digest_changed");
    return { digest: body.machine_info_digest, changes: { machineInfoDigest: body.machine_info_digest } };
  }
  return { digest: activation.machineInfoDigest, changes: {} };
}
