import { Elysia } from "elysia";
import { readDeviceProofHeaders } from "../../http/device-proof.ts";
import { runtimeCall } from "../../http/runtime-call.ts";
import { errorEnvelopeResponse } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { sealedFileKeyModels } from "./model.ts";

/** Key release for a sealed file (device proof); the file itself never reaches the service. */
export const sealedFileKeysController = ({ sealedFileKeys, signer }: Services) =>
  new Elysia({ prefix: "/runtime/v1/activations", detail: { tags: ["Runtime"], security: [] } })
    .model(sealedFileKeyModels)
    .post(
      "/:id/sealed-file-keys",
      async ({ params, body, request, set }) => {
        const result = await sealedFileKeys.release(
          params.id,
          readDeviceProofHeaders(request.headers),
          body,
          runtimeCall(request),
        );
        return signer.respond({ request, set }, 200, result.data, result);
      },
      {
        body: "sealed-file-key.request",
        response: { 200: "sealed-file-key.result" },
        detail: {
          summary: "The data key of a sealed file, sealed to this activation's KEM key (device proof)",
          security: [{ deviceProof: [] }],
          responses: {
            409: errorEnvelopeResponse(
              "SEALED_FILES_UNAVAILABLE: this environment does not offer sealed files.",
            ),
            503: errorEnvelopeResponse(
              "SEALED_FILES_KEY_UNAVAILABLE (retryable): the sealing key cannot be reached.",
            ),
          },
        },
      },
    );
