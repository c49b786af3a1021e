import { Type } from "@sinclair/typebox";
import { EmailAddressField } from "../../http/email-field.ts";
import { IdField } from "../../http/schemas.ts";
import { NONCE, signed } from "../activations/model.ts";

const DeviceKey = Type.String({ maxLength: 200, description: "ed25519:… or p256:…" });
const Locale = Type.String({
  maxLength: 35,
  pattern: "^[A-Za-z]{2,8}([_-][A-Za-z0-9]{1,8})*$",
  description: "BCP 47 tag for the mail; unknown locales fall back to English.",
});

export const EmailVerificationStart = Type.Object(
  {
    product_id: IdField(),
    license_key: Type.String({ minLength: 1, maxLength: 64 }),
    email: EmailAddressField(),
    device_signing_public_key: DeviceKey,
    nonce: NONCE,
    locale: Type.Optional(Locale),
    sdk_version: Type.Optional(IdField()),
  },
  { additionalProperties: false },
);

export const EmailVerificationConfirm = Type.Object(
  {
    code: Type.String({ pattern: "^[0-9]{6}$", description: "The six digits from the email." }),
    second_factor_code: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 64,
        description: "Authenticator code (six digits) or a recovery code, for users with two-factor.",
      }),
    ),
    device_signing_public_key: DeviceKey,
    nonce: NONCE,
    sdk_version: Type.Optional(IdField()),
  },
  { additionalProperties: false },
);

export const VerificationStartResult = signed({
  verification_id: Type.String(),
  expires_at: Type.String({ format: "date-time" }),
  resend_after_sec: Type.Integer(),
  code_length: Type.Integer(),
});

export const NamedUserTokenResult = signed({
  named_user_token: Type.String(),
  expires_at: Type.String({ format: "date-time" }),
});

export const emailVerificationModels = {
  "email_verification.start": EmailVerificationStart,
  "email_verification.confirm": EmailVerificationConfirm,
  "email_verification.start_result": VerificationStartResult,
  "named_user_token.result": NamedUserTokenResult,
};

export type EmailVerificationStartBody = typeof EmailVerificationStart.static;
export type EmailVerificationConfirmBody = typeof EmailVerificationConfirm.static;
