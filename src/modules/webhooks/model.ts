import { Type } from "@sinclair/typebox";
import { pageParams } from "../../http/pagination.ts";
import { DateTime, dataOf, JsonObject, listOf, NameField, Nullable } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";
import { MAX_URL_LENGTH } from "./destinations.ts";

export const MAX_EVENTS = 100;
/** The longest overlap a rotation may ask for: a week, like an online key's delegation. */
export const MAX_OVERLAP_SEC = 7 * 86_400;
export const DEFAULT_OVERLAP_SEC = 86_400;

const Name = NameField();
const Url = Type.String({
  minLength: 1,
  maxLength: MAX_URL_LENGTH,
  description:
    "https URL of the receiver (http too when the operator allows private networks). Slack, Discord and Teams workflow URLs are recognised and get a chat message.",
});
const Events = Type.Array(Type.String({ minLength: 1, maxLength: 100 }), {
  minItems: 1,
  maxItems: MAX_EVENTS,
  description: 'Event names from the catalogue in docs/api.md, or "*" for every event.',
});

export const WebhookCreate = Type.Object(
  {
    name: Type.Optional(Name),
    url: Url,
    events: Type.Optional(Events),
  },
  { additionalProperties: false, description: 'name defaults to the URL\'s host, events to ["*"].' },
);

export const WebhookUpdate = Type.Object(
  {
    name: Type.Optional(Name),
    url: Type.Optional(Url),
    events: Type.Optional(Events),
    status: Type.Optional(
      StringEnum(["active"] as const, "Re-enables an endpoint disabled by a 410 from its receiver."),
    ),
  },
  { additionalProperties: false },
);

export const RotateSecret = Type.Object(
  {
    overlap_sec: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_OVERLAP_SEC,
        description: `How long the old secret keeps signing beside the new one; default ${DEFAULT_OVERLAP_SEC}.`,
      }),
    ),
  },
  { additionalProperties: false },
);

export const Webhook = Type.Object({
  public_id: Type.String(),
  name: Type.String(),
  url: Nullable(Type.String({ description: "null for team-chat destinations: their URL is a secret." })),
  url_host: Type.String({ description: "The receiver's host, shown for every destination." }),
  destination: StringEnum(["webhook", "slack", "discord", "teams"] as const),
  events: Type.Array(Type.String()),
  status: StringEnum(["active", "disabled", "stopped"] as const),
  disabled_reason: Nullable(Type.String({ description: "`gone`: the receiver answered 410." })),
  secret_rotation: Type.Object({
    scheduled: Type.Boolean({
      description: "True while the previous secret still signs beside the new one.",
    }),
    activates_at: Nullable(DateTime("When the new secret becomes the only one that signs.")),
  }),
  created_at: DateTime(),
  updated_at: DateTime(),
});

export const WebhookWithSecret = Type.Object({
  ...Webhook.properties,
  secret: Nullable(
    Type.String({
      description:
        "whsec_…, shown only in this response. null for team-chat destinations, which are not signed.",
    }),
  ),
});

export const Attempt = Type.Object({
  number: Type.Integer(),
  started_at: DateTime(),
  duration_ms: Type.Integer(),
  outcome: StringEnum(["succeeded", "failed", "refused"] as const),
  response_status: Nullable(Type.Integer()),
  error: Nullable(Type.String()),
});

export const Delivery = Type.Object({
  id: Type.String(),
  webhook_id: Type.String(),
  message_id: Type.String({ description: "The webhook-id header: msg_…, the same on every attempt." }),
  event_type: Type.String(),
  environment: Type.String(),
  status: StringEnum(["pending", "delivering", "succeeded", "failed", "cancelled"] as const),
  attempts: Type.Integer(),
  next_attempt_at: Nullable(DateTime()),
  last_response_status: Nullable(Type.Integer()),
  last_error: Nullable(Type.String()),
  created_at: DateTime(),
  completed_at: Nullable(DateTime()),
});

export const DeliveryDetail = Type.Object({
  ...Delivery.properties,
  payload: JsonObject("The body as signed and sent: { type, timestamp, environment, data }."),
  attempt_log: Type.Array(Attempt, { description: "Every attempt, oldest first." }),
});

export const DeliveryListQuery = Type.Object({
  ...pageParams,
  status: Type.Optional(StringEnum(["pending", "delivering", "succeeded", "failed", "cancelled"] as const)),
});

export const webhookModels = {
  "webhook.create": WebhookCreate,
  "webhook.update": WebhookUpdate,
  "webhook.rotate": RotateSecret,
  "webhook.response": dataOf(Webhook),
  "webhook.created": dataOf(WebhookWithSecret),
  "webhook.list": listOf(Webhook),
  "webhook.delivery": dataOf(DeliveryDetail),
  "webhook.delivery-list": listOf(Delivery),
};

export type WebhookCreateBody = typeof WebhookCreate.static;
export type WebhookUpdateBody = typeof WebhookUpdate.static;
