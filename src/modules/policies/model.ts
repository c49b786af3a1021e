import { Type } from "@sinclair/typebox";
import {
  BILLING_CYCLES,
  CONCURRENCY_UNITS,
  FAIL_MODES,
  FINGERPRINT_PROFILES,
  IDENTITY_MODES,
  LICENSE_TYPES,
  PERPETUAL_MODES,
  POLICY_NUMBER_BOUNDS,
  RENEWAL_AUTHORITIES,
  VALIDATION_MODES,
} from "../../domain/policy-rules.ts";
import { pageParams } from "../../http/pagination.ts";
import { DateTime, dataOf, IdField, JsonObject, listOf, NameField, Nullable } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";

type Bounded = keyof typeof POLICY_NUMBER_BOUNDS;

/**
 * A numeric setting with the bounds it has on every plan (policy-rules.ts), so /openapi.json
 * states the rules the service enforces; a bound a plan narrows is named in the description.
 */
const Bounded = (field: Bounded, description: string, planBound?: string) => {
  const { min, max } = POLICY_NUMBER_BOUNDS[field];
  const plan = planBound
    ? ` ${planBound}: the bounds here hold on every plan; the workspace plan may narrow them (422 keyed by the field).`
    : "";
  return Type.Integer({ minimum: min, maximum: max, description: `${description}${plan}` });
};

/** Every settable policy field; all optional here, `product_id` and `name` required on create. */
const settings = {
  license_type: Type.Optional(StringEnum(LICENSE_TYPES, "Default perpetual.")),
  validation_mode: Type.Optional(
    StringEnum(
      VALIDATION_MODES,
      "online: activation + heartbeats; hybrid: online or offline packages; offline: offline packages only.",
    ),
  ),
  fail_mode: Type.Optional(
    StringEnum(
      FAIL_MODES,
      "What a device does when it cannot reach the service after its certificate lapses.",
    ),
  ),
  identity_mode: Type.Optional(StringEnum(IDENTITY_MODES)),
  perpetual_mode: Type.Optional(
    StringEnum(
      PERPETUAL_MODES,
      "unmanaged: offline perpetual, usable only through a device-bound offline package.",
    ),
  ),
  concurrency_unit: Type.Optional(
    StringEnum(CONCURRENCY_UNITS, "What one floating seat is: a device, or an app instance."),
  ),
  fingerprint_profile: Type.Optional(StringEnum(FINGERPRINT_PROFILES)),
  renewal_authority: Type.Optional(StringEnum(RENEWAL_AUTHORITIES)),
  billing_cycle: Type.Optional(StringEnum(BILLING_CYCLES)),
  heartbeat_required: Type.Optional(Type.Boolean()),
  max_machines: Type.Optional(Bounded("max_machines", "Machine slots per license (default 1).")),
  max_concurrent: Type.Optional(
    Nullable(Bounded("max_concurrent", "Floating seats per license; null for no floating limit.")),
  ),
  license_unit_limit: Type.Optional(
    Nullable(Bounded("license_unit_limit", "Named users per license; null for no limit.")),
  ),
  cert_ttl_sec: Type.Optional(
    Bounded(
      "cert_ttl_sec",
      "Lifetime of a license certificate; with network_grace_sec when failing open, at most the plan's revocation_exposure_max_sec.",
      "At most the plan's cert_ttl_max_sec",
    ),
  ),
  heartbeat_sec: Type.Optional(
    Bounded(
      "heartbeat_sec",
      "Heartbeat interval; at most cert_ttl_sec.",
      "At least the plan's activation_sync_min_sec",
    ),
  ),
  lease_ttl_sec: Type.Optional(
    Bounded(
      "lease_ttl_sec",
      "A lease expires this long after its last heartbeat.",
      "At least the plan's floating_lease_ttl_min_sec",
    ),
  ),
  lease_heartbeat_sec: Type.Optional(
    Bounded(
      "lease_heartbeat_sec",
      "Lease heartbeat interval; shorter than lease_ttl_sec.",
      "At least the plan's floating_sync_min_sec",
    ),
  ),
  network_grace_sec: Type.Optional(
    Bounded(
      "network_grace_sec",
      "How long a fail-open device keeps working offline after its certificate lapses.",
    ),
  ),
  trial_days: Type.Optional(Bounded("trial_days", "Trial length in days; at least 1 for a trial policy.")),
  entitlements: Type.Optional(
    JsonObject(
      "Entitlement name -> true/false, or a JSON value for limits whose numbers are integers within ±(2^53−1).",
    ),
  ),
};

export const PolicyCreate = Type.Object(
  {
    product_id: IdField(),
    name: NameField(),
    ...settings,
  },
  { additionalProperties: false },
);

export const PolicyUpdate = Type.Object(
  {
    product_id: Type.Optional(IdField()),
    name: Type.Optional(NameField()),
    ...settings,
  },
  { additionalProperties: false },
);

export const Policy = Type.Object({
  public_id: Type.String(),
  product_id: Type.String(),
  environment: StringEnum(["live", "test"] as const),
  name: Type.String(),
  version: Type.Integer({
    description: "Historical policy number, bumped by every change. Not a concurrency token: use the ETag.",
  }),
  status: StringEnum(["active", "retired"] as const),
  license_type: StringEnum(LICENSE_TYPES),
  validation_mode: StringEnum(VALIDATION_MODES),
  fail_mode: StringEnum(FAIL_MODES),
  identity_mode: StringEnum(IDENTITY_MODES),
  perpetual_mode: StringEnum(PERPETUAL_MODES),
  concurrency_unit: StringEnum(CONCURRENCY_UNITS),
  renewal_authority: StringEnum(RENEWAL_AUTHORITIES),
  billing_cycle: StringEnum(BILLING_CYCLES),
  heartbeat_required: Type.Boolean(),
  revocation_guarantee_sec: Type.Integer({
    description:
      "Longest a revoked license can keep working offline: cert_ttl_sec (+ network_grace_sec when failing open).",
  }),
  license_unit_limit: Nullable(Type.Integer()),
  max_machines: Type.Integer(),
  max_concurrent: Nullable(Type.Integer()),
  cert_ttl_sec: Type.Integer(),
  heartbeat_sec: Type.Integer(),
  lease_ttl_sec: Type.Integer(),
  lease_heartbeat_sec: Type.Integer(),
  network_grace_sec: Type.Integer(),
  trial_days: Type.Integer(),
  fingerprint_profile: Type.Object({
    name: StringEnum(FINGERPRINT_PROFILES),
    on_machine_change: Type.String(),
    baseline_max_age_sec: Type.Integer(),
  }),
  entitlements: JsonObject("Entitlement name -> value."),
  created_at: DateTime(),
  updated_at: DateTime(),
});

export const PolicyListQuery = Type.Object({
  ...pageParams,
  product_id: Type.Optional(Type.String({ maxLength: 64, description: "Only this product's policies." })),
});

export const policyModels = {
  "policy.create": PolicyCreate,
  "policy.update": PolicyUpdate,
  "policy.response": dataOf(Policy),
  "policy.list": listOf(Policy),
};

export type PolicyCreateBody = typeof PolicyCreate.static;
export type PolicyUpdateBody = typeof PolicyUpdate.static;
