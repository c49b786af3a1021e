import { Type } from "@sinclair/typebox";
import { OFFLINE_REQUEST_FORMAT } from "../../crypto/offline-package.ts";
import { DateTime, IdField, Nullable, SafeInteger } from "../../http/schemas.ts";
import { MachineInfo, NONCE } from "../activations/model.ts";

/** What the device generates (docs/protocol.md "Offline request"); signed as a whole. */
export const OfflineRequest = Type.Object(
  {
    format: Type.Literal(OFFLINE_REQUEST_FORMAT),
    product_id: IdField(),
    device_signing_public_key: Type.String({ maxLength: 200, description: "ed25519:… or p256:…" }),
    device_kem_public_key: Type.String({ maxLength: 200, description: "p256:…" }),
    device_proof: Type.String({
      maxLength: 1024,
      description:
        'sign(device signing key, "Service-Offline-Request-v1\\n" + JCS(request without device_proof))',
    }),
    machine_info: MachineInfo,
    nonce: NONCE,
    generated_at: SafeInteger({ description: "Unix seconds on the device when the request was made." }),
  },
  { additionalProperties: false },
);

export const OfflineCertificateCreate = Type.Object(
  {
    request: OfflineRequest,
    expires_at: Type.Optional(
      DateTime("When the package expires; default: the license's expiry, or the plan's longest license."),
    ),
    license_assignment_id: Type.Optional(
      Nullable(IdField("Named-user assignment; null or absent for device licenses.")),
    ),
  },
  { additionalProperties: false },
);

export const offlineModels = { "offline-certificate.create": OfflineCertificateCreate };

export type OfflineRequestBody = typeof OfflineRequest.static;
export type OfflineCertificateBody = typeof OfflineCertificateCreate.static;
