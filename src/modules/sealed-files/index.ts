import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { errorEnvelopeResponse } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { sealedFileModels } from "./model.ts";

/** Sealed-file status and its one-way enabling (spec §4.3 "Products", rule 4). */
export const sealedFilesController = ({ sealedFiles }: Services) =>
  new Elysia({ prefix: "/mgmt/v1/products", detail: { tags: ["Products"] } })
    .use(managementAuth)
    .model(sealedFileModels)
    .get(
      "/:id/sealed-files",
      ({ caller, params }) => ({ data: sealedFiles.status(params.id, caller.environment) }),
      {
        scope: "products:read",
        response: { 200: "sealed-files.response" },
        detail: {
          summary:
            "Sealed-file status, the current public sealing key, and every key with its status (409 for an archived product)",
          responses: { 409: errorEnvelopeResponse("PRODUCT_ARCHIVED.") },
        },
      },
    )
    .post(
      "/:id/sealed-files",
      ({ caller, params, request }) => ({
        data: sealedFiles.enable(params.id, changeContext(caller, request)),
      }),
      {
        scope: "products:write",
        response: { 200: "sealed-files.response" },
        detail: {
          summary:
            "Enable sealed files (idempotent; cannot be turned off). Creates the product's sealing key on first use.",
          responses: {
            403: errorEnvelopeResponse(
              "INSUFFICIENT_SCOPE, or PLAN_ENTITLEMENT_REQUIRED (details.entitlement: sealed_files).",
            ),
            409: errorEnvelopeResponse(
              "PRODUCT_ARCHIVED, or SEALED_FILES_UNAVAILABLE (this environment does not offer them).",
            ),
            503: errorEnvelopeResponse(
              "SEALED_FILES_KEY_UNAVAILABLE (retryable): the keystore could not store the key.",
            ),
          },
        },
      },
    );
