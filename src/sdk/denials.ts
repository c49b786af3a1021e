/**
 * Which of two signed answers about one activation is the newer word: a stored license-state
 * denial (LICENSE_REVOKED, ...) or another answer (a heartbeat, an offline package). Calls that do
 * not wait for each other (heartbeats, lease calls, sealed-file key requests) can land in any
 * order, so each answer is placed by the second the server signed it. Times are whole seconds: of
 * two answers of one second which came first cannot be told, and a license revoked in that second
 * must not read valid until the next heartbeat, so a denial stands over an answer of its own
 * second. A denial of the license itself (revoked, expired, suspended) is also remembered by
 * license, and stands against that license's offline packages of any activation issued before it.
 * Callers hold `ClientState.activationRecords` around the read and the writes it decides.
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
 * The codes that tell the state of the license itself, not of one activation: whichever
 * activation the denial named, every package of the license issued before it is old news.
 * (ACTIVATION_DEACTIVATED ends one activation; NAMED_USER_ASSIGNMENT_UNAVAILABLE one user's use.)
 */
const LICENSE_WIDE_CODES: ReadonlySet<string> = new Set([
  "LICENSE_REVOKED",
  "LICENSE_EXPIRED",
  "LICENSE_SUSPENDED",
]);

/**
 * The remembered license-state denial of this license that an answer signed at `serverTime`
 * does not overtake: an offline package issued before a revocation does not lift it, whether it
 * is for the activation the denial named or another one (one the vendor made after a
 * force-deactivation), and whether or not the device still holds the denied activation.
 */
export async function standingLicenseDenial(
  state: ClientState,
  licenseId: string,
  serverTime: number,
): Promise<StoredDenial | undefined> {
  const denial = await state.licenseDenial(licenseId);
  return denial !== undefined && denial.server_time >= serverTime ? denial : undefined;
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

/** The record of a signed denial (kind "license") answered about `activationId`. */
export function deniedAs(error: SdkError, activationId: string): StoredDenial {
  return {
    code: error.code,
    activation_id: activationId,
    server_time: Number(error.details.server_time),
    request_id: error.requestId ?? "",
    details: error.details,
    ...(error.status === undefined ? {} : { status: error.status }),
    ...(error.serverError === undefined ? {} : { server_error: error.serverError }),
  };
}

/**
 * Remembers a signed license-state denial answered to an activation request (activation create,
 * trial confirm) by the license its signed details name (`license_id`; a server that names none is
 * older, and nothing is remembered). The device holds no activation it is about, so it is not the
 * stored `denial`: only the license's older offline packages are refused with it.
 */
export async function storeActivationRefusal(state: ClientState, error: SdkError): Promise<void> {
  const licenseId = error.details.license_id;
  if (!LICENSE_WIDE_CODES.has(error.code) || typeof licenseId !== "string" || licenseId === "") return;
  await state.recordLicenseDenial(licenseId, deniedAs(error, ""));
}

/** A license status other than active, as the code of the denial that says the same. */
const STATUS_CODES: ReadonlyMap<string, string> = new Map([
  ["revoked", "LICENSE_REVOKED"],
  ["expired", "LICENSE_EXPIRED"],
  ["suspended", "LICENSE_SUSPENDED"],
]);

/**
 * Remembers a license state a signed success reported: a heartbeat on a suspended license answers
 * 200 with `license_status: "suspended"` and a certificate saying so, never a LICENSE_SUSPENDED
 * denial (protocol §16). Remembered as that denial, at the answer's second, by license: deactivate()
 * forgets the certificate and the heartbeat, and a package of the license issued before must
 * still be refused. Whatever becomes of the answer (overtaken, its activation ended meanwhile),
 * the license's state at that second was signed.
 */
export async function storeReportedStatus(
  state: ClientState,
  heard: {
    licenseId: string;
    activationId: string;
    statuses: readonly unknown[];
    serverTime: number;
    requestId: string;
  },
): Promise<void> {
  const status = heard.statuses.find((s): s is string => typeof s === "string" && STATUS_CODES.has(s));
  const code = status === undefined ? undefined : STATUS_CODES.get(status);
  if (status === undefined || code === undefined) return;
  await state.recordLicenseDenial(heard.licenseId, {
    code,
    activation_id: heard.activationId,
    server_time: heard.serverTime,
    request_id: heard.requestId,
    details: { activation_id: heard.activationId, license_status: status },
  });
}

/** True for an error made by `overtakenBy`. */
export const isOvertaken = (error: SdkError): boolean => error.details.overtaken_server_time !== undefined;

/**
 * Stores a denial of the activation the client holds, unless it lands after a newer word (an
 * answer the stored state came from, a heartbeat, an activation or an offline package, or a denial
 * the server signed in a later second): then it is history, and the call it answered failed
 * without changing what is stored. A heartbeat's own denial is always stored: heartbeats run one
 * at a time, so it is the newest word whatever the server's clock says. An ended activation stays
 * ended, whatever was signed before. A stored license-state denial is also remembered by its
 * license (`licenseId`, the held activation's), for standingLicenseDenial.
 */
export async function storeDenial(
  state: ClientState,
  denial: StoredDenial,
  options: { fromHeartbeat: boolean; licenseId: string },
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
  // First: the remembered one outlives this activation, and must not be lost to a crash between.
  if (LICENSE_WIDE_CODES.has(denial.code)) await state.recordLicenseDenial(options.licenseId, denial);
  await state.setJson("denial", denial);
}
