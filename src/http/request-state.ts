import type { ApiKeyIdentity } from "../modules/api-keys/service.ts";
import type { RuntimeAdmission } from "./runtime-limits.ts";

/**
 * Per-request facts gathered before routing (request id, the authenticated caller). Keyed by the
 * Request object itself, so nothing outlives the request and nothing is shared between requests.
 */
export interface RequestState {
  requestId: string;
  startedAt: number;
  caller?: ApiKeyIdentity;
  /** The body exactly as received: device proofs sign its hash, not the parsed JSON. */
  rawBody?: Uint8Array;
  /** The code of the error this request was answered with, once it has one. */
  errorCode?: string;
  /** A runtime request the limits let through, to be charged and counted once it is answered. */
  runtime?: RuntimeAdmission;
  /** Settles `runtime` for a request no route matched (runtime-limits.ts): called on its 404. */
  finishUnrouted?: (request: Request) => void;
}

const states = new WeakMap<Request, RequestState>();

export const requestState = {
  set(request: Request, state: RequestState): void {
    states.set(request, state);
  },
  get(request: Request): RequestState | undefined {
    return states.get(request);
  },
};
