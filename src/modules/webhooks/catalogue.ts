/**
 * The event names an endpoint can subscribe to (docs/api.md "Webhook events"). Every audit event
 * type is delivered as a webhook event of the same name; the runtime-side ones come from the
 * activation, lease and trial code and from the expiry scan of the dispatcher.
 */
export const AUDIT_EVENT_TYPES = [
  "product.created",
  "product.updated",
  "product.archived",
  "product.sealed_files_enabled",
  "policy.created",
  "policy.updated",
  "policy.retired",
  "customer.created",
  "customer.updated",
  "customer.archived",
  "license.created",
  "license.updated",
  "license.suspended",
  "license.reinstated",
  "license.renewed",
  "license.revoked",
  "license.trial_converted",
  "license.offline_package_issued",
  "reseller.created",
  "reseller.updated",
  "activation.deactivated",
  "device_block.created",
  "device_block.removed",
  "api_key.created",
  "api_key.revoked",
  "workspace.plan_changed",
  "license.expired",
  "license_user.created",
  "license_user.updated",
  "license_user.disabled",
  "license_user.two_factor_enrolled",
  "license_user.two_factor_enabled",
  "license_user.two_factor_disabled",
  "license_user.two_factor_unlocked",
  "license_user.passkey_link_created",
  "license_user.passkey_registered",
  "license_assignment.created",
  "license_assignment.removed",
  "billing_integration.configured",
  "billing_integration.disabled",
  "billing_offering.created",
  "billing_offering.removed",
  "billing_event.failed",
  "signing_key.rotated",
  "signing_key.retired",
  "signing_key.compromised",
  "sealing_key.rotated",
  "sealing_key.retired",
  "sealing_key.compromised",
  "webhook.created",
  "webhook.updated",
  "webhook.stopped",
  "webhook.secret_rotated",
] as const;

/** Events with no audit entry: a device or the passing of time caused them, not a vendor's call. */
export const RUNTIME_EVENT_TYPES = [
  "activation.created",
  "activation.deactivated",
  "lease.expired",
  "license.expired",
  "trial.started",
] as const;

export const EVENT_TYPES: readonly string[] = [...new Set([...AUDIT_EVENT_TYPES, ...RUNTIME_EVENT_TYPES])];

export type RuntimeEventType = (typeof RUNTIME_EVENT_TYPES)[number];

/** `*` subscribes to everything, including types added in later versions. */
export const ALL_EVENTS = "*";

const KNOWN = new Set<string>([...EVENT_TYPES, ALL_EVENTS]);

export const isKnownEvent = (name: string): boolean => KNOWN.has(name);

/** Whether an endpoint subscribed to `events` receives `type`. */
export const subscribes = (events: readonly string[], type: string): boolean =>
  events.includes(ALL_EVENTS) || events.includes(type);
