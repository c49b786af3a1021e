import { Type } from "@sinclair/typebox";
import { IdField } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";
import { signed } from "../activations/model.ts";

const InstanceId = Type.String({
  minLength: 1,
  maxLength: 128,
  description: "The app instance holding the seat.",
});

export const LeaseCreate = Type.Object(
  { activation_id: IdField(), instance_id: InstanceId },
  { additionalProperties: false },
);
export const LeaseInstance = Type.Object({ instance_id: InstanceId }, { additionalProperties: false });

const ActivationId = Type.String({
  description: "The activation holding the lease: a client checks it is its own (protocol §14).",
});

const lease = {
  lease_id: Type.String(),
  activation_id: ActivationId,
  instance_id: Type.String(),
  expires_at: Type.Integer({ description: "Unix seconds." }),
  heartbeat_in: Type.Integer({ description: "Seconds until the next lease heartbeat." }),
};

export const leaseModels = {
  "lease.create": LeaseCreate,
  "lease.instance": LeaseInstance,
  "lease.result": signed(lease),
  "lease.released": signed({
    lease_id: Type.String(),
    activation_id: ActivationId,
    status: StringEnum(["released"] as const),
  }),
};

export type LeaseCreateBody = typeof LeaseCreate.static;
