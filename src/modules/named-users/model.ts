import { Type } from "@sinclair/typebox";
import { EmailAddressField } from "../../http/email-field.ts";
import { pageParams } from "../../http/pagination.ts";
import { DateTime, dataOf, IdField, listOf, NameField, Nullable } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";

const Email = EmailAddressField(
  "A plain address; the local part is kept as typed, an international domain as punycode; unique in any case.",
);

const editable = {
  name: Type.Optional(Nullable(NameField())),
  external_ref: Type.Optional(
    Nullable(Type.String({ maxLength: 200, description: "Your own id for this user." })),
  ),
  customer_id: Type.Optional(Nullable(IdField("The customer this user belongs to, if any."))),
};

export const LicenseUserCreate = Type.Object(
  { email: Email, ...editable },
  { additionalProperties: false, description: "A local-ID user, identified by email." },
);

export const LicenseUserUpdate = Type.Object(
  {
    email: Type.Optional(Email),
    ...editable,
    status: Type.Optional(
      StringEnum(
        ["active", "disabled"] as const,
        "`disabled` is the same as DELETE; `active` enables a disabled user again.",
      ),
    ),
  },
  { additionalProperties: false },
);

export const TwoFactorState = Type.Object({
  status: StringEnum(["none", "pending", "enabled"] as const),
  locked: Type.Boolean({
    description: "After too many wrong second factors; unlock with .../two-factor/unlock.",
  }),
  recovery_codes_remaining: Type.Integer(),
  passkeys: Type.Integer({
    description: "Registered passkeys; any makes a second factor required, like TOTP.",
  }),
});

export const LicenseUser = Type.Object({
  public_id: Type.String(),
  environment: StringEnum(["live", "test"] as const),
  email: Type.String(),
  name: Nullable(Type.String()),
  external_ref: Nullable(Type.String()),
  customer_id: Nullable(Type.String()),
  identity: Type.Literal("local", { description: "Local-ID user (not linked to an OIDC connection)." }),
  status: StringEnum(["active", "disabled"] as const),
  two_factor: TwoFactorState,
  created_at: DateTime(),
  updated_at: DateTime(),
  disabled_at: Nullable(DateTime()),
});

export const LicenseUserListQuery = Type.Object({
  ...pageParams,
  email: Type.Optional(
    Type.String({ maxLength: 254, description: "Only users with this address (any case)." }),
  ),
  status: Type.Optional(StringEnum(["active", "disabled"] as const)),
});

export const Assignment = Type.Object({
  public_id: Type.String(),
  license_id: Type.String(),
  user_id: Type.String(),
  status: StringEnum(["active", "removed"] as const),
  created_at: DateTime(),
  removed_at: Nullable(DateTime()),
});

export const AssignmentCreate = Type.Object({ user_id: IdField() }, { additionalProperties: false });

export const AssignmentListQuery = Type.Object({
  ...pageParams,
  status: Type.Optional(StringEnum(["active", "removed"] as const)),
});

export const TotpEnrolment = Type.Object({
  user_id: Type.String(),
  otpauth_uri: Type.String({ description: "otpauth://totp/… for an authenticator app (shown once)." }),
  secret: Type.String({ description: "The same secret in base32, for manual entry (shown once)." }),
  recovery_codes: Type.Array(Type.String(), { description: "Ten single-use recovery codes (shown once)." }),
});

export const TotpConfirm = Type.Object(
  { code: Type.String({ minLength: 6, maxLength: 6, pattern: "^[0-9]{6}$" }) },
  { additionalProperties: false },
);

export const namedUserModels = {
  "license_user.create": LicenseUserCreate,
  "license_user.update": LicenseUserUpdate,
  "license_user.response": dataOf(LicenseUser),
  "license_user.list": listOf(LicenseUser),
  "assignment.create": AssignmentCreate,
  "assignment.response": dataOf(Assignment),
  "assignment.list": listOf(Assignment),
  "two_factor.enrolment": dataOf(TotpEnrolment),
  "two_factor.confirm": TotpConfirm,
  "passkey.registration_link": dataOf(
    Type.Object({
      url: Type.String({ description: "Open in the user's browser; the token is in the fragment." }),
      expires_at: DateTime(),
    }),
  ),
};

export type LicenseUserCreateBody = typeof LicenseUserCreate.static;
export type LicenseUserUpdateBody = typeof LicenseUserUpdate.static;
