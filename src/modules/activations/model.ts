import { Type } from "@sinclair/typebox";
import { ApiError } from "../../http/errors.ts";
import { DateTime, dataOf, IdField, listOf, Nullable, SafeInteger } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";

export const NONCE = Type.String({
  pattern: "^[A-Za-z0-9_-]{22,255}$",
  description: "22-255 of A-Z a-z 0-9 _ -",
});
const Version = IdField();

export const MachineInfo = Type.Object(
  {
    os: Type.String({ minLength: 1, maxLength: 64 }),
    arch: Type.String({ minLength: 1, maxLength: 64 }),
  },
  {
    // Integers, not floats, and within ±(2^53−1): the body is signed as JCS (I-JSON), and float
    // formatting is easy to get wrong.
    additionalProperties: Type.Union([Type.String({ maxLength: 256 }), SafeInteger(), Type.Boolean()]),
    maxProperties: 32,
    description:
      "os and arch, plus up to 30 more scalar facts; machine_info_digest = hex(SHA-256(JCS(machine_info))).",
  },
);

const MAX_SIGNAL_NAME_LENGTH = 64;

/**
 * TypeBox's Record checks no constraint of its key schema, so `propertyNames` only documents the
 * name rule (for the OpenAPI document); `checkMachineSignalNames` enforces it. The key pattern
 * matches every name: TypeBox's default, `^(.*)$`, misses a name with a line break, and checks
 * nothing about such a member's value.
 */
export const MachineSignals = Type.Record(
  Type.String({ pattern: "^[\\s\\S]*$" }),
  Type.String({ maxLength: 256 }),
  {
    maxProperties: 32,
    propertyNames: { minLength: 1, maxLength: MAX_SIGNAL_NAME_LENGTH },
    description: `Up to 32 members, names 1-${MAX_SIGNAL_NAME_LENGTH} characters, values strings of at most 256.`,
  },
);

/**
 * The rest of the body schema for machine_signals: names of 1-64 UTF-16 code units (as maxLength
 * counts the values). Keyed at `machine_signals`, never at the name, which may be any length.
 */
export function checkMachineSignalNames(signals: Record<string, string> | undefined): void {
  const names = Object.keys(signals ?? {});
  if (names.some((name) => name.length < 1 || name.length > MAX_SIGNAL_NAME_LENGTH)) {
    throw ApiError.validation({
      machine_signals: [`member names are 1-${MAX_SIGNAL_NAME_LENGTH} characters`],
    });
  }
}

export const ActivationCreate = Type.Object(
  {
    license_key: Type.String({ minLength: 1, maxLength: 64 }),
    product_id: IdField(),
    device_signing_public_key: Type.String({ maxLength: 200, description: "ed25519:… or p256:…" }),
    device_kem_public_key: Type.String({ maxLength: 200, description: "p256:…" }),
    device_proof: Type.String({ maxLength: 1024 }),
    machine_info: MachineInfo,
    machine_signals: Type.Optional(MachineSignals),
    app_version: Type.Optional(Version),
    sdk_version: Type.Optional(Version),
    request_id: Type.Optional(Type.String({ maxLength: 128 })),
    client_time: SafeInteger({ description: "Unix seconds on the device." }),
    named_user_token: Type.Optional(Type.String({ maxLength: 1024 })),
    nonce: NONCE,
  },
  { additionalProperties: false },
);

export const Heartbeat = Type.Object(
  {
    machine_info: Type.Optional(MachineInfo),
    machine_info_digest: Type.Optional(Type.String({ pattern: "^[0-9a-f]{64}$" })),
    app_version: Type.Optional(Version),
    sdk_version: Type.Optional(Version),
  },
  { additionalProperties: false },
);

/** The members a signed runtime answer carries beside `data` or `error` (docs/protocol.md §5, §16). */
export const SignedEnvelope = {
  response_assertion: Type.Object({
    v: Type.Integer(),
    product_id: Type.String(),
    key_id: Type.String(),
    parent_key_id: Type.String(),
    request_id: Type.String(),
    nonce: Type.String(),
    server_time: Type.Integer(),
    status: Type.Integer(),
    body_sha256: Type.String(),
  }),
  response_signature: Type.String(),
  signing_delegation: Type.Object({
    delegation: Type.Object({
      v: Type.Integer(),
      purpose: Type.Literal("runtime-response"),
      product_id: Type.String(),
      parent_key_id: Type.String(),
      online_key_id: Type.String(),
      public_key: Type.String(),
      issued_at: Type.Integer(),
      expires_at: Type.Integer(),
    }),
    signature: Type.String(),
  }),
};

export const signed = <T extends Parameters<typeof Type.Object>[0]>(data: T) =>
  Type.Object({ data: Type.Object(data), ...SignedEnvelope });
export const signedString = () => Type.Object({ data: Type.String(), ...SignedEnvelope });

export const ActivationResult = signed({
  activation_id: Type.String(),
  certificate: Type.String({ description: "JWS license certificate (docs/protocol.md)." }),
  machine_info_digest: Type.String(),
});

export const HeartbeatResult = signed({
  activation_id: Type.String(),
  license_status: StringEnum(["active", "suspended"] as const),
  certificate: Type.String(),
  next_heartbeat_in: Type.Integer({ description: "Seconds until the next heartbeat, with jitter." }),
  machine_info_digest: Type.String(),
});

export const Activation = Type.Object({
  id: Type.String(),
  license_id: Type.String(),
  product_id: Type.String(),
  status: StringEnum(["active", "deactivated"] as const),
  machine: Type.Object({
    info: Type.Record(Type.String(), Type.Unknown()),
    info_digest: Type.String(),
    signals: Type.Record(Type.String(), Type.String()),
  }),
  device_signing_key_thumbprint: Type.String(),
  first_seen_at: DateTime(),
  last_seen_at: DateTime(),
  deactivated_at: Nullable(DateTime()),
  deactivation_reason: Nullable(StringEnum(["device", "vendor", "culled"] as const)),
});

export const ActivationDetail = Type.Intersect([
  Activation,
  Type.Object({
    activated_at: DateTime(),
    last_heartbeat_at: Nullable(DateTime()),
    heartbeat_interval_sec: Type.Integer(),
    next_heartbeat_due: Type.Object({ earliest: DateTime(), latest: DateTime() }),
    heartbeat_overdue: Type.Boolean(),
    certificate_expires_at: DateTime(),
    app_version: Nullable(Type.String()),
    sdk_version: Nullable(Type.String()),
  }),
]);

export const activationModels = {
  "activation.create": ActivationCreate,
  "activation.result": ActivationResult,
  "heartbeat.request": Heartbeat,
  "heartbeat.result": HeartbeatResult,
  "deactivation.result": signedString(),
  "activation.list": listOf(Activation),
  "activation.response": dataOf(ActivationDetail),
};

export type ActivationCreateBody = typeof ActivationCreate.static;
export type HeartbeatBody = typeof Heartbeat.static;

/** What idempotency compares: a retry carries a fresh nonce, proof and clock reading, and is otherwise the same. */
export function idempotentPartOf(body: ActivationCreateBody) {
  const {
    nonce: _nonce,
    device_proof: _proof,
    client_time: _time,
    request_id: _request,
    // Single use: a retry after a lost answer carries a fresh one.
    named_user_token: _token,
    ...rest
  } = body;
  return rest;
}
