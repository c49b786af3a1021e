import type { RuntimeCall } from "../modules/activations/gate.ts";
import { pathAndQueryOf } from "./request-path.ts";
import { requestState } from "./request-state.ts";

/** The plain facts of a runtime request that services need: no HTTP objects beyond this point. */
export function runtimeCall(request: Request): RuntimeCall {
  const state = requestState.get(request);
  return {
    requestId: state?.requestId ?? "req_unknown",
    method: request.method,
    pathAndQuery: pathAndQueryOf(request.url),
    rawBody: state?.rawBody ?? new Uint8Array(0),
    proof: state?.runtime?.device,
  };
}
