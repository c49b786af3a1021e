/**
 * When an offline package of another activation may replace the one a device holds (docs/sdk.md,
 * "Devices that never go online"): only as the newer signed word, never as a rollback. Callers
 * hold `ClientState.activationRecords` around the checks and the writes they decide.
 */
import { decodeCertificate } from "./certificate.ts";
import { verificationError } from "./errors.ts";
import type { ClientState } from "./state.ts";

/**
 * A package of another activation than the one held replaces it only when it is the newer word:
 * issued after the newest signed answer behind what is stored (the certificate, a later
 * heartbeat, a signed denial of the held activation). Otherwise it is a rollback (an older package
 * loaded over a newer one), or of the same second, when which came first cannot be told.
 */
export async function refuseUnlessNewerThanHeld(
  state: ClientState,
  heldActivationId: string,
  issuedAt: number,
): Promise<void> {
  const denial = await state.denialForUpdate();
  const heldSince = Math.max(
    (await state.newestAnswer()) ?? 0,
    await storedCertificateIat(state),
    denial?.activation_id === heldActivationId ? denial.server_time : 0,
  );
  if (issuedAt <= heldSince)
    throw verificationError(
      "PACKAGE_SUPERSEDED",
      "the device holds another activation from a newer signed answer; nothing changed",
      { issued_at: issuedAt, newest_answer: heldSince, held_activation_id: heldActivationId },
    );
}

/** A package of an activation a newer package replaced here must be newer than that one. */
export async function refuseReplacedSince(
  state: ClientState,
  activationId: string,
  issuedAt: number,
): Promise<void> {
  const replacedAt = await state.replacedAt(activationId);
  if (replacedAt !== undefined && issuedAt <= replacedAt)
    throw verificationError(
      "PACKAGE_SUPERSEDED",
      "a newer package replaced the package's activation on this device; nothing changed",
      { issued_at: issuedAt, newest_answer: replacedAt, activation_id: activationId },
    );
}

/**
 * The stored certificate's `iat`, unverified (0 when there is none, or it cannot be read): it
 * only ever makes the check above refuse more, and newest_answer is the verified mark; this
 * covers storage written before that mark existed.
 */
async function storedCertificateIat(state: ClientState): Promise<number> {
  const jws = await state.get("certificate");
  if (jws === undefined) return 0;
  try {
    return decodeCertificate(jws).claims.iat;
  } catch {
    return 0;
  }
}
