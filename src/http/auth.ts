import { Elysia } from "elysia";
import type { Scope } from "../domain/scopes.ts";
import type { ApiKeyIdentity } from "../modules/api-keys/service.ts";
import { ApiError } from "./errors.ts";
import { requestState } from "./request-state.ts";

/**
 * `Authorization: Bearer <token>` (RFC 6750 §2.1). The scheme is case-insensitive (RFC 9110
 * §11.1: `bearer` and `BEARER` are the same), one or more spaces follow it (`1*SP`, §11.6.2), and
 * the token is the rest, one run of characters without white space.
 */
const BEARER = /^Bearer +(\S+)$/i;

/** The token of a Bearer Authorization header, or undefined for any other or none. */
export const bearerToken = (authorization: string | null): string | undefined =>
  authorization ? BEARER.exec(authorization)?.[1] : undefined;

/**
 * `scope: "products:read"` on a route: the caller (authenticated before routing) must hold that
 * scope. Checked in `transform`, i.e. before the body is validated, so a caller without the scope
 * learns nothing about the schema. The route then receives `caller`.
 */
export const managementAuth = new Elysia({ name: "management-auth" }).macro({
  scope: (scope: Scope) => ({
    detail: { security: [{ managementApiKey: [] }], "x-required-scope": scope },
    transform({ request }) {
      const caller = requestState.get(request)?.caller;
      if (!caller) throw new ApiError("UNAUTHENTICATED", "Send an API key as 'Authorization: Bearer <key>'.");
      if (!caller.scopes.has(scope)) {
        throw insufficientScope(scope);
      }
    },
    resolve({ request }): { caller: ApiKeyIdentity } {
      const caller = requestState.get(request)?.caller;
      if (!caller) throw new ApiError("UNAUTHENTICATED", "Send an API key as 'Authorization: Bearer <key>'.");
      return { caller };
    },
  }),
});

export const insufficientScope = (scope: string) =>
  new ApiError("INSUFFICIENT_SCOPE", `This operation needs the ${scope} scope.`, { required_scope: scope });

/** Route (method + template) -> the scope its `scope` macro declared, read from the built app. */
export function scopeRegistry(routes: readonly { method: string; path: string; hooks: unknown }[]) {
  const scopes = new Map<string, string>();
  for (const route of routes) {
    const scope = (route.hooks as { detail?: Record<string, unknown> } | undefined)?.detail?.[
      "x-required-scope"
    ];
    if (typeof scope === "string") scopes.set(`${route.method} ${route.path}`, scope);
  }
  return (method: string, route: string) => scopes.get(`${method} ${route}`);
}
