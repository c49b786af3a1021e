import { Elysia } from "elysia";
import { OFFLINE_PACKAGE_MEDIA_TYPE } from "../../crypto/offline-package.ts";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { errorEnvelopeResponse } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { offlineModels } from "./model.ts";

/** `POST /mgmt/v1/licenses/{id}/offline-certificates`: a device's request in, its package out. */
export const offlineController = ({ offlinePackages }: Services) =>
  new Elysia({ prefix: "/mgmt/v1/licenses", detail: { tags: ["Licenses"] } })
    .use(managementAuth)
    .model(offlineModels)
    .post(
      "/:id/offline-certificates",
      ({ caller, params, body, request }) => {
        const issued = offlinePackages.issue(params.id, body, changeContext(caller, request));
        return new Response(new Blob([new Uint8Array(issued.bytes)]), {
          status: 200,
          headers: {
            "content-type": OFFLINE_PACKAGE_MEDIA_TYPE,
            "content-disposition": `attachment; filename="${issued.id}.zip"`,
            "x-offline-package-id": issued.id,
            ...(issued.replayed ? { "idempotent-replayed": "true" } : {}),
          },
        });
      },
      {
        scope: "licenses:write",
        body: "offline-certificate.create",
        detail: {
          summary: "Issue a device-bound offline package (ZIP) for a device's offline request",
          responses: {
            200: {
              description:
                "The package: manifest.json, manifest.sig, license.jwt, trust-bundle.json (docs/protocol.md). An identical request answers the stored bytes while the package stays valid.",
              content: { [OFFLINE_PACKAGE_MEDIA_TYPE]: { schema: { type: "string", format: "binary" } } },
              headers: {
                "X-Offline-Package-Id": { $ref: "#/components/headers/X-Offline-Package-Id" },
                // An identical request's stored bytes, answered again.
                "Idempotent-Replayed": { $ref: "#/components/headers/Idempotent-Replayed" },
              },
            },
            403: errorEnvelopeResponse(
              "INSUFFICIENT_SCOPE; PLAN_ENTITLEMENT_REQUIRED (offline_packages); LICENSE_REVOKED, LICENSE_EXPIRED, LICENSE_SUSPENDED, LICENSE_BLOCKED, DEVICE_BLOCKED.",
            ),
            409: errorEnvelopeResponse(
              "OFFLINE_REQUEST_USED (generate a new request), MACHINE_LIMIT_REACHED, DEVICE_KEY_MISMATCH, SIGNING_KEY_PENDING, PRODUCT_ARCHIVED.",
            ),
            422: errorEnvelopeResponse(
              "VALIDATION_FAILED (request fields, device_proof, generated_at, expires_at), OFFLINE_PACKAGE_NOT_ALLOWED.",
            ),
          },
        },
      },
    );
