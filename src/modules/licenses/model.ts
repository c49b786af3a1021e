import { Type } from "@sinclair/typebox";
import { LICENSE_TYPES, MAX_LICENSE_COUNT, RENEWAL_AUTHORITIES } from "../../domain/policy-rules.ts";
import { pageParams } from "../../http/pagination.ts";
import { DateTime, dataOf, IdField, JsonObject, listOf, Metadata, Nullable } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";

/** The bounds of the policy's own setting (docs/api.md "Policies"): 1 to 1,000,000. */
const Override = (description: string) =>
  Nullable(Type.Integer({ minimum: 1, maximum: MAX_LICENSE_COUNT, description }));
const Expiry = Nullable(
  DateTime("When the license expires; null for never. `expires_at` and `expiry` are the same field."),
);

export const LicenseCreate = Type.Object(
  {
    product_id: IdField(),
    policy_id: IdField(),
    customer_id: Type.Optional(Nullable(IdField())),
    license_type: Type.Optional(
      StringEnum(LICENSE_TYPES, "Must equal the policy's license_type; defaults to it."),
    ),
    expires_at: Type.Optional(Expiry),
    expiry: Type.Optional(Expiry),
    renewal_authority: Type.Optional(StringEnum(RENEWAL_AUTHORITIES)),
    max_machines: Type.Optional(Override("Overrides the policy's max_machines.")),
    max_concurrent: Type.Optional(Override("Overrides the policy's max_concurrent.")),
    license_unit_limit_override: Type.Optional(Override("Overrides the policy's license_unit_limit.")),
    entitlements: Type.Optional(JsonObject("Overrides merged over the policy's entitlements.")),
    metadata: Type.Optional(Metadata()),
  },
  { additionalProperties: false },
);

export const LicenseUpdate = Type.Object(
  {
    expires_at: Type.Optional(Expiry),
    expiry: Type.Optional(Expiry),
    renewal_authority: Type.Optional(StringEnum(RENEWAL_AUTHORITIES)),
    max_machines_override: Type.Optional(Override("null clears the override.")),
    max_concurrent_override: Type.Optional(Override("null clears the override.")),
    license_unit_limit_override: Type.Optional(Override("null clears the override.")),
    entitlements: Type.Optional(JsonObject("Replaces the license's entitlement overrides.")),
    metadata: Type.Optional(Metadata()),
    status_action: Type.Optional(
      StringEnum(
        ["active", "suspended"] as const,
        "The target state: suspended, or active to reinstate/resume.",
      ),
    ),
    reason: Type.Optional(Type.String({ maxLength: 500 })),
  },
  { additionalProperties: false },
);

export const ConvertTrial = Type.Object(
  {
    target_policy_id: IdField(),
    expires_at: Type.Optional(Expiry),
    entitlement_overrides: Type.Optional(JsonObject("Merged into the license's entitlement overrides.")),
  },
  { additionalProperties: false },
);

export const License = Type.Object({
  public_id: Type.String(),
  environment: StringEnum(["live", "test"] as const),
  product_id: Type.String(),
  policy_id: Type.String(),
  customer_id: Nullable(Type.String()),
  key: Type.String({
    description:
      "25 Crockford base32 characters in five groups; accepted in any case, with or without dashes.",
  }),
  license_type: StringEnum(LICENSE_TYPES),
  status: StringEnum(["active", "suspended", "revoked", "expired"] as const),
  status_reason: Nullable(Type.String()),
  expires_at: Nullable(DateTime()),
  renewal_authority: StringEnum(RENEWAL_AUTHORITIES),
  max_machines: Type.Integer({ description: "Effective: the override, else the policy's." }),
  max_concurrent: Nullable(Type.Integer()),
  license_unit_limit: Nullable(Type.Integer()),
  max_machines_override: Nullable(Type.Integer()),
  max_concurrent_override: Nullable(Type.Integer()),
  license_unit_limit_override: Nullable(Type.Integer()),
  entitlements: JsonObject("Effective: the policy's entitlements with the license's overrides on top."),
  entitlement_overrides: JsonObject("The license's own overrides."),
  metadata: Metadata(),
  version: Type.Integer({ description: "Concurrency token: send it as If-Match." }),
  created_at: DateTime(),
  updated_at: DateTime(),
  suspended_at: Nullable(DateTime()),
  revoked_at: Nullable(DateTime()),
  converted_at: Nullable(DateTime()),
});

export const LicenseListQuery = Type.Object({
  ...pageParams,
  product_id: Type.Optional(IdField()),
  customer_id: Type.Optional(IdField()),
});

export const licenseModels = {
  "license.create": LicenseCreate,
  "license.update": LicenseUpdate,
  "license.convert-trial": ConvertTrial,
  "license.response": dataOf(License),
  "license.list": listOf(License),
};

export type LicenseCreateBody = typeof LicenseCreate.static;
export type LicenseUpdateBody = typeof LicenseUpdate.static;
export type ConvertTrialBody = typeof ConvertTrial.static;
