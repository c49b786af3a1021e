import { Type } from "@sinclair/typebox";
import { EMAIL_ADDRESS_PATTERN } from "../../domain/email-address.ts";
import { pageParams } from "../../http/pagination.ts";
import { DateTime, dataOf, listOf, NameField, Nullable } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";

/** A plain addr-spec only (src/domain/email-address.ts): never a display name a mailer could read another address from. */
export const EMAIL_PATTERN = EMAIL_ADDRESS_PATTERN;

const fields = {
  name: Type.Optional(Nullable(NameField())),
  email: Type.Optional(Nullable(Type.String({ maxLength: 254, pattern: EMAIL_PATTERN }))),
  external_ref: Type.Optional(
    Nullable(Type.String({ maxLength: 200, description: "Your own id for this customer." })),
  ),
  notes: Type.Optional(Nullable(Type.String({ maxLength: 5000 }))),
};

export const CustomerCreate = Type.Object(fields, {
  additionalProperties: false,
  description: "At least one of name or email.",
});
export const CustomerUpdate = Type.Object(fields, { additionalProperties: false });

export const Customer = Type.Object({
  public_id: Type.String(),
  name: Nullable(Type.String()),
  email: Nullable(Type.String()),
  external_ref: Nullable(Type.String()),
  notes: Nullable(Type.String()),
  status: StringEnum(["active", "archived"] as const),
  created_at: DateTime(),
  updated_at: DateTime(),
});

export const CustomerListQuery = Type.Object({
  ...pageParams,
  email: Type.Optional(
    Type.String({ maxLength: 254, description: "Only customers with this address (case-insensitive)." }),
  ),
});

export const customerModels = {
  "customer.create": CustomerCreate,
  "customer.update": CustomerUpdate,
  "customer.response": dataOf(Customer),
  "customer.list": listOf(Customer),
};

export type CustomerBody = typeof CustomerCreate.static;
