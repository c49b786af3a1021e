import { Type } from "@sinclair/typebox";
import { dataOf, IdField, Nullable } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";

export const TrialSignupPatch = Type.Object(
  {
    policy_id: Type.Optional(
      Nullable(IdField("A trial policy of this product; null stops sign-ups (always allowed).")),
    ),
    daily_limit: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 100_000,
        description: "New trials per rolling 24 hours (1-100000; default 100).",
      }),
    ),
  },
  { additionalProperties: false },
);

export const TrialSignupSettings = Type.Object({
  product_id: Type.String(),
  policy_id: Nullable(Type.String()),
  daily_limit: Type.Integer(),
  status: StringEnum([
    "accepting",
    "disabled",
    "not_entitled",
    "policy_unavailable",
    "limit_reached",
    "product_archived",
  ] as const),
  started_last_24_hours: Type.Integer({
    description: "New trial licenses made by sign-up in the last 24 hours.",
  }),
  version: Type.Integer({ description: "The product's version: send it as If-Match." }),
});

export const trialSignupModels = {
  "trial-signup.patch": TrialSignupPatch,
  "trial-signup.response": dataOf(TrialSignupSettings),
};

export type TrialSignupPatchBody = typeof TrialSignupPatch.static;
