import { Type } from "@sinclair/typebox";
import { DateTime, dataOf, Nullable } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";

export const BILLING_STATUSES = ["not_configured", "active", "disabled", "not_entitled"] as const;
export const EVENT_RESULTS = ["succeeded", "ignored", "failed"] as const;

export const BillingOffering = Type.Object({
  id: Type.String(),
  name: Nullable(Type.String()),
  billing_price_id: Type.String({ description: "The provider's price id (Stripe `price_…`)." }),
  product_id: Type.String(),
  policy_id: Type.String(),
  status: StringEnum(["active", "removed"] as const, "removed offerings create no new licenses."),
  license_duration_days: Nullable(
    Type.Integer({
      description:
        "How long a license bought once lasts (and a subscription's until its first paid invoice); null: the policy's default.",
    }),
  ),
});

export const BillingIntegrationStatus = Type.Object({
  registered: Type.Boolean({
    description: "An integration is configured for this key's environment and is not disabled.",
  }),
  provider: Nullable(StringEnum(["stripe"] as const)),
  mode: StringEnum(
    ["live", "test"] as const,
    "The provider mode this key's environment takes events from: a live key sees the live integration, a test key the test one.",
  ),
  status: StringEnum(
    BILLING_STATUSES,
    "not_configured: never set up; active: events are received; disabled: `licensing billing disable` ran (secrets forgotten); not_entitled: the plan lacks billing_integration (events are refused until it has it).",
  ),
  secure_claims_required: Type.Boolean({
    description:
      "true: a bought license key is revealed only once, through a single-use claim link; the email carries the link, never the key. false: the email carries the key itself.",
  }),
  license_claim_url: Nullable(
    Type.String({
      description: "The claim page; a buyer's link is this URL with `#<claim token>` appended.",
    }),
  ),
  webhook_url: Type.String({ description: "Where to point the provider's webhook endpoint." }),
  last_event: Nullable(
    Type.Object({
      id: Type.String(),
      type: Type.String(),
      result: StringEnum(EVENT_RESULTS),
      reason: Nullable(Type.String()),
      at: DateTime(),
    }),
  ),
  last_failure: Nullable(
    Type.Object(
      {
        id: Type.String(),
        type: Type.String(),
        result: StringEnum(["failed"] as const),
        reason: Nullable(Type.String()),
        at: DateTime(),
        resolved_at: Nullable(
          DateTime(
            "When a later delivery of the same event (a resend) was applied; null while it has not been.",
          ),
        ),
      },
      {
        description:
          "The last event that failed, kept when later events succeed (only the next failure replaces it); null before the first.",
      },
    ),
  ),
  unresolved_failures: Type.Integer({
    minimum: 0,
    description:
      "Events answered `failed` for a cause the vendor can fix that no later delivery has applied: each needs its cause fixed and the event resent. Terminal failures (malformed_event, no_period_end, subscription_ended) are not counted.",
  }),
  offerings: Type.Array(BillingOffering),
});

export const ClaimRequest = Type.Object(
  {
    token: Type.String({
      minLength: 1,
      maxLength: 128,
      description: "The claim token: what follows `#` in the claim link.",
    }),
  },
  { additionalProperties: false },
);

export const ClaimResult = Type.Object({
  license_id: Type.String(),
  product_id: Type.String(),
  product_name: Type.String(),
  license_key: Type.String({ description: "Shown this once; the claim is used up." }),
  expires_at: Nullable(DateTime()),
});

export const WebhookReceipt = Type.Object({
  event_id: Type.String(),
  result: StringEnum(EVENT_RESULTS),
  replayed: Type.Boolean({ description: "true: the event was processed before and nothing changed now." }),
});

export const billingModels = {
  "billing-integration.response": dataOf(BillingIntegrationStatus),
};

export const billingPublicModels = {
  "billing-claim.request": ClaimRequest,
  "billing-claim.response": dataOf(ClaimResult),
  "billing-webhook.receipt": dataOf(WebhookReceipt),
};

export type BillingIntegrationView = typeof BillingIntegrationStatus.static;
