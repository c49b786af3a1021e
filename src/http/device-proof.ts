import type { Database } from "bun:sqlite";
import { sha256Hex } from "../crypto/encoding.ts";
import { PREFIX } from "../crypto/envelope.ts";
import { canonicalize } from "../crypto/jcs.ts";
import { isOnCurve, type PublicKeyInfo, parsePublicKey, verifySignature } from "../crypto/keys.ts";
import { ApiError } from "./errors.ts";

/** DESIGN §5: a proof more than 300 s from the server clock is refused, and nonces are kept that long. */
export const CLOCK_SKEW_SEC = 300;
const NONCE_PATTERN = /^[A-Za-z0-9_-]{22,255}$/;
/** Canonical decimal only: the server signs its own rendering, so "0042" must not pass as 42. */
const TIMESTAMP_PATTERN = /^(0|-?[1-9]\d{0,14})$/;

export interface DeviceProofHeaders {
  activationId: string;
  timestamp: number;
  nonce: string;
  signature: string;
}

/** The four headers of a device-proof call; missing or malformed ones are 400 (DESIGN §4). */
export function readDeviceProofHeaders(headers: Headers): DeviceProofHeaders {
  const activationId = headers.get("x-service-activation");
  const timestamp = headers.get("x-service-timestamp");
  const nonce = headers.get("x-service-nonce");
  const signature = headers.get("x-service-signature");
  const problems: Record<string, string[]> = {};
  if (!activationId || activationId.length > 64) problems["x-service-activation"] = ["is required"];
  if (!timestamp || !TIMESTAMP_PATTERN.test(timestamp))
    problems["x-service-timestamp"] = ["must be Unix seconds"];
  if (!nonce || !NONCE_PATTERN.test(nonce))
    problems["x-service-nonce"] = ["must be 22-255 of A-Z a-z 0-9 _ -"];
  if (!signature || signature.length > 1024)
    problems["x-service-signature"] = ["is required, at most 1024 characters"];
  if (Object.keys(problems).length > 0) {
    throw new ApiError("INVALID_REQUEST", "Device-proof headers are missing or malformed.", {
      errors: problems,
    });
  }
  return {
    activationId: activationId as string,
    timestamp: Number(timestamp),
    nonce: nonce as string,
    signature: signature as string,
  };
}

/** The exact string a device signs (DESIGN §5). */
export function deviceProofMessage(input: {
  method: string;
  pathAndQuery: string;
  activationId: string;
  timestamp: number;
  nonce: string;
  body: Uint8Array;
}): string {
  return `${PREFIX.deviceProof}${input.method}\n${input.pathAndQuery}\n${input.activationId}\n${input.timestamp}\n${input.nonce}\n${sha256Hex(input.body)}`;
}

export const proofInvalid = (reason: string) =>
  new ApiError("DEVICE_PROOF_INVALID", "The device proof does not verify.", { reason });

const clockSkew = (nowSec: number) =>
  new ApiError("CLOCK_SKEW", "The device clock differs from the server clock by more than 300 seconds.", {
    server_time: nowSec,
  });

/** Rows one purge statement reads at most: an unlimited purge runs as several of them. */
const NONCE_PURGE_STATEMENT_ROWS = 2_000;

/** The fields of a request that carries the device's keys and a proof over its own body. */
export interface BodyProof {
  device_signing_public_key: string;
  device_kem_public_key: string;
  client_time: number;
  device_proof: string;
}

/**
 * A request proved by the body itself (activation create, trial confirm): both device keys
 * well-formed (a P-256 KEM key), the device clock within the window, and `device_proof` over
 * `prefix` + the JCS of every other field. Each route has its own prefix, so a proof made for one
 * can never be replayed on the other. Returns the device's signing key.
 */
export function verifyBodyProof(body: BodyProof, prefix: string, nowSec: number): PublicKeyInfo {
  // The proof below is by this key, so its point is decoded only to explain a failure (keys.ts).
  const signingKey = parsePublicKey(body.device_signing_public_key, { signatureFollows: true });
  const kemKey = parsePublicKey(body.device_kem_public_key);
  // The slow check runs only for requests that fail anyway: an off-curve key stays a 422.
  const keyError = (signingKeyOk: boolean) => {
    const errors: Record<string, string[]> = {};
    if (!signingKeyOk)
      errors.device_signing_public_key = ["must be ed25519:<b64u 32 bytes> or p256:<b64u 65-byte point>"];
    if (kemKey?.alg !== "p256")
      errors.device_kem_public_key = ["must be p256:<b64u 65-byte uncompressed point>"];
    return ApiError.validation(errors);
  };
  if (!signingKey || kemKey?.alg !== "p256") throw keyError(signingKey !== null && isOnCurve(signingKey));
  if (Math.abs(nowSec - body.client_time) > CLOCK_SKEW_SEC) {
    throw isOnCurve(signingKey) ? clockSkew(nowSec) : keyError(false);
  }
  const { device_proof, ...signedPart } = body;
  if (!verifySignature(signingKey, prefix + canonicalize(signedPart), device_proof)) {
    throw isOnCurve(signingKey) ? proofInvalid("invalid_signature") : keyError(false);
  }
  return signingKey;
}

/**
 * Checks a device proof against the activation's key: clock window, signature, then the nonce,
 * which is recorded (in the store, so restarts keep it) only once the signature has verified.
 */
export class DeviceProofVerifier {
  private readonly remember;
  private readonly purge;

  constructor(sqlite: Database) {
    this.remember = sqlite.prepare<unknown, [string, string, number]>(
      "INSERT INTO device_nonces (activation_id, nonce, seen_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
    );
    this.purge = sqlite.prepare<unknown, [number, number]>(
      // Rows arrive in time order, so the oldest are at the front of the table (migration 0020)
      // and a statement reads at most its batch of rows from there. seen_at still decides: a row
      // stamped later than the rows behind it (the clock was set back by D) stays until its own
      // window has passed, and while a whole batch of such rows leads the table nothing behind
      // them is purged: for at most D, during which the table grows.
      `DELETE FROM device_nonces WHERE id IN
       (SELECT id FROM device_nonces ORDER BY id LIMIT ?2) AND seen_at < ?1`,
    );
  }

  verify(
    proof: DeviceProofHeaders,
    request: { method: string; pathAndQuery: string; body: Uint8Array },
    deviceKey: PublicKeyInfo,
    nowSec: number,
  ): void {
    if (Math.abs(nowSec - proof.timestamp) > CLOCK_SKEW_SEC) throw clockSkew(nowSec);
    const message = deviceProofMessage({ ...request, ...proof });
    if (!verifySignature(deviceKey, message, proof.signature)) throw proofInvalid("invalid_signature");
    if (this.remember.run(proof.activationId, proof.nonce, nowSec).changes === 0)
      throw proofInvalid("replayed");
  }

  /**
   * Records a nonce under a scope other than an activation (an activation request, keyed by the
   * device key); false when it was already used within the window.
   */
  rememberOnce(scope: string, nonce: string, nowSec: number): boolean {
    return this.remember.run(scope, nonce, nowSec).changes === 1;
  }

  /**
   * A nonce can be replayed only while its timestamp is within the window: twice the skew is
   * plenty. At most `limit` rows per call: a whole minute of nonces deleted at once stalled every
   * request behind it for ~0.1 s at load (docs/performance.md), so the sweeper calls this often
   * with a small batch, off the request path.
   */
  purgeOld(nowSec: number, limit = Number.MAX_SAFE_INTEGER): number {
    const before = nowSec - 2 * CLOCK_SKEW_SEC;
    let purged = 0;
    while (purged < limit) {
      const batch = Math.min(NONCE_PURGE_STATEMENT_ROWS, limit - purged);
      const deleted = this.purge.run(before, batch).changes;
      purged += deleted;
      // Fewer than asked: the front of the table is inside the window (or the table is empty).
      if (deleted < batch) break;
    }
    return purged;
  }
}
