import type { ChangeContext } from "../deps.ts";
import type { ApiKeyIdentity } from "../modules/api-keys/service.ts";
import { requestState } from "./request-state.ts";

/** The audit context of a management request: the API key acting, in its environment. */
export function changeContext(caller: ApiKeyIdentity, request: Request): ChangeContext {
  return {
    actor: { type: "api_key", id: caller.id, name: caller.name },
    environment: caller.environment,
    requestId: requestState.get(request)?.requestId ?? null,
  };
}
