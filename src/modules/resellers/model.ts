import { Type } from "@sinclair/typebox";
import { DateTime, dataOf, listOf, Metadata, NameField, Nullable } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";
import { EMAIL_PATTERN } from "../customers/model.ts";

export const RESELLER_STATUSES = ["active", "suspended", "archived"] as const;

const fields = {
  email: Type.Optional(Nullable(Type.String({ maxLength: 254, pattern: EMAIL_PATTERN }))),
  external_ref: Type.Optional(Nullable(Type.String({ maxLength: 200 }))),
  organization_limit: Type.Optional(
    Nullable(Type.Integer({ minimum: 0, maximum: 10_000_000, description: "null for no limit." })),
  ),
  user_limit: Type.Optional(
    Nullable(Type.Integer({ minimum: 0, maximum: 10_000_000, description: "null for no limit." })),
  ),
  status: Type.Optional(
    StringEnum(RESELLER_STATUSES, "Default active. archived sets archived_at; moving back clears it."),
  ),
  metadata: Type.Optional(Metadata()),
};

export const ResellerCreate = Type.Object({ name: NameField(), ...fields }, { additionalProperties: false });
export const ResellerUpdate = Type.Object(
  { name: Type.Optional(NameField()), ...fields },
  { additionalProperties: false },
);

export const Reseller = Type.Object({
  public_id: Type.String(),
  name: Type.String(),
  email: Nullable(Type.String()),
  external_ref: Nullable(Type.String()),
  status: StringEnum(RESELLER_STATUSES),
  organization_limit: Nullable(Type.Integer()),
  user_limit: Nullable(Type.Integer()),
  metadata: Metadata(),
  archived_at: Nullable(DateTime()),
  created_at: DateTime(),
  updated_at: DateTime(),
});

export const resellerModels = {
  "reseller.create": ResellerCreate,
  "reseller.update": ResellerUpdate,
  "reseller.response": dataOf(Reseller),
  "reseller.list": listOf(Reseller),
};

export type ResellerCreateBody = typeof ResellerCreate.static;
export type ResellerUpdateBody = typeof ResellerUpdate.static;
