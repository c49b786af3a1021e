import { Type } from "@sinclair/typebox";
import { EmailAddressField } from "../../http/email-field.ts";
import { IdField, SafeInteger } from "../../http/schemas.ts";
import { MachineInfo, MachineSignals, NONCE, signed } from "../activations/model.ts";

const Version = IdField();

/** A plain addr-spec (src/domain/email-address.ts): the limits and the mailer must see one and the same mailbox. */
const Email = EmailAddressField(
  "The address the code is sent to, a plain addr-spec (no display name); compared case-insensitively.",
);

const Locale = Type.String({
  maxLength: 35,
  pattern: "^[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*$",
  description: "BCP 47 tag for the mail, e.g. en or de-AT; English when no template matches.",
});

export const TrialStart = Type.Object(
  {
    product_id: IdField(),
    email: Email,
    device_signing_public_key: Type.String({ maxLength: 200, description: "ed25519:… or p256:…" }),
    nonce: NONCE,
    locale: Type.Optional(Locale),
    sdk_version: Type.Optional(Version),
  },
  { additionalProperties: false },
);

export const TrialStartResult = signed({
  verification_id: Type.String(),
  expires_at: Type.String({ format: "date-time" }),
  resend_after_sec: Type.Integer({
    description: "Wait this long before starting again for the same address.",
  }),
  code_length: Type.Integer(),
});

export const TrialConfirm = Type.Object(
  {
    code: Type.String({ maxLength: 16, description: "The six digits from the mail." }),
    email: Email,
    device_signing_public_key: Type.String({ maxLength: 200, description: "ed25519:… or p256:…" }),
    device_kem_public_key: Type.String({ maxLength: 200, description: "p256:…" }),
    device_proof: Type.String({
      maxLength: 1024,
      description: 'sign(device key, "Service-Trial-Proof-v1\\n" + JCS(body without device_proof)).',
    }),
    machine_info: MachineInfo,
    machine_signals: Type.Optional(MachineSignals),
    app_version: Type.Optional(Version),
    sdk_version: Type.Optional(Version),
    request_id: Type.Optional(Type.String({ maxLength: 128 })),
    client_time: SafeInteger({ description: "Unix seconds on the device." }),
    nonce: NONCE,
  },
  { additionalProperties: false },
);

export const TrialConfirmResult = signed({
  activation_id: Type.String(),
  certificate: Type.String({ description: "JWS license certificate (docs/protocol.md)." }),
  machine_info_digest: Type.String(),
  license_id: Type.String({ description: "The trial license; its key is never returned to the device." }),
});

export const trialModels = {
  "trial-verification.start": TrialStart,
  "trial-verification.started": TrialStartResult,
  "trial-verification.confirm": TrialConfirm,
  "trial-verification.result": TrialConfirmResult,
};

export type TrialStartBody = typeof TrialStart.static;
export type TrialConfirmBody = typeof TrialConfirm.static;
