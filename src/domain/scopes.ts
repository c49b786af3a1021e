export const ENVIRONMENTS = ["live", "test"] as const;
export type Environment = (typeof ENVIRONMENTS)[number];

/** Management API scopes (spec 5.1). */
export const SCOPES = [
  "products:read",
  "products:write",
  "policies:read",
  "policies:write",
  "customers:read",
  "customers:write",
  "licenses:read",
  "licenses:write",
  "activations:delete",
  "webhooks:read",
  "webhooks:write",
  "events:read",
  "reports:read",
] as const;
export type Scope = (typeof SCOPES)[number];

export const isScope = (value: string): value is Scope => (SCOPES as readonly string[]).includes(value);
