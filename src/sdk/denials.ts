/**
 * Which of two signed answers about one activation is the newer word: a stored license-state
 * denial (LICENSE_REVOKED, ...) or another answer (a heartbeat, an offline package). Calls that do
 * not wait for each other (heartbeats, lease calls, sealed-file key requests) can land in any
 * order, so each answer is placed by the second the server signed it. Times are whole seconds: of
 * two answers of one second which came first cannot be told, and a license revoked in that second
 * must not read valid until the next heartbeat, so a denial stands over an answer of its own
 * second. Callers hold `ClientState.activationRecords` around the read and the writes it decides.
 */
import { SdkError } from "./errors.ts";
import type { ClientState, StoredDenial } from "./state.ts";

/** The stored denial of this activation that an answer signed at `serverTime` does not overtake. */
export async function standingDenial(
  state: ClientState,
  activationId: string,
  serverTime: number,
): Promise<StoredDenial | undefined> {
  const denial = await state.denialForUpdate();
  return denial?.activation_id === activationId && denial.server_time >= serverTime ? denial : undefined;
}

/**
 * The error for an answer a stored denial stands over: the denial as it was received (its code,
 * kind "license": it passed the whole verification chain then), with `overtaken_server_time` in
 * its details. The heartbeat loop does not stop for it (the next answer decides; loop.ts).
 */
export function overtakenBy(denial: StoredDenial, serverTime: number): SdkError {
  return new SdkError(
    denial.code,
    `a signed ${denial.code} of the same second or later stands over this answer`,
    {
      kind: "license",
      details: {
        ...denial.details,
        signed: true,
        server_time: denial.server_time,
        overtaken_server_time: serverTime,
      },
      ...(denial.status === undefined ? {} : { status: denial.status }),
      ...(denial.server_error === undefined ? {} : { serverError: denial.server_error }),
      ...(denial.request_id ? { requestId: denial.request_id } : {}),
    },
  );
}

/** True for an error made by `overtakenBy`. */
export const isOvertaken = (error: SdkError): boolean => error.details.overtaken_server_time !== undefined;

/**
 * Stores a denial of the activation the client holds, unless it lands after a newer word (an
 * answer the stored state came from, a heartbeat, an activation or an offline package, or a denial
 * the server signed in a later second): then it is history, and the call it answered failed
 * without changing what is stored. A heartbeat's own denial is always stored: heartbeats run one
 * at a time, so it is the newest word whatever the server's clock says. An ended activation stays
 * ended, whatever was signed before.
 */
export async function storeDenial(
  state: ClientState,
  denial: StoredDenial,
  options: { fromHeartbeat: boolean },
): Promise<void> {
  if (denial.code === "ACTIVATION_DEACTIVATED") {
    await state.setJson("denial", denial);
    await state.clearActivation(denial.activation_id);
    return;
  }
  if (!options.fromHeartbeat) {
    const stored = await state.denialForUpdate();
    const newest = Math.max(
      (await state.newestAnswer()) ?? Number.NEGATIVE_INFINITY,
      stored?.activation_id === denial.activation_id ? stored.server_time : Number.NEGATIVE_INFINITY,
    );
    if (newest > denial.server_time) return;
  }
  await state.setJson("denial", denial);
}
