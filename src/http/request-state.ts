import type { ApiKeyIdentity } from "../modules/api-keys/service.ts";

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
