import { Elysia } from "elysia";
import { readDeviceProofHeaders } from "../../http/device-proof.ts";
import { runtimeCall } from "../../http/runtime-call.ts";
import { RequiredIdempotencyHeaders } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { activationModels, checkMachineSignalNames } from "./model.ts";

const ROUTE = "/runtime/v1/activations";

/** Activation create (license key + device proof in the body), heartbeat and deactivation (device proof headers). */
export const runtimeActivationsController = ({ activations, signer }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Runtime"], security: [] } })
    .model(activationModels)
    .post(
      "",
      async ({ body, headers, request, set }) => {
        checkMachineSignalNames(body.machine_signals);
        const outcome = await activations.activateOnce(
          body,
          headers["idempotency-key"],
          runtimeCall(request),
        );
        // Stored unsigned: a replay is signed afresh for this request's nonce (DESIGN §4).
        const response = signer.respond({ request, set }, outcome.status, outcome.value, {
          productId: body.product_id,
          nonce: body.nonce,
        });
        if (outcome.replayed) response.headers.set("idempotent-replayed", "true");
        return response;
      },
      {
        body: "activation.create",
        headers: RequiredIdempotencyHeaders,
        response: { 201: "activation.result" },
        detail: { summary: "Activate a device (license key and device proof in the body)" },
      },
    )
    .post(
      "/:id/heartbeat",
      async ({ params, body, request, set }) => {
        const result = await activations.heartbeat(
          params.id,
          readDeviceProofHeaders(request.headers),
          body,
          runtimeCall(request),
        );
        return signer.respond({ request, set }, 200, result.data, result);
      },
      {
        body: "heartbeat.request",
        response: { 200: "heartbeat.result" },
        detail: { summary: "Check in (device proof)", security: [{ deviceProof: [] }] },
      },
    )
    .delete(
      "/:id",
      async ({ params, request, set }) => {
        const result = await activations.deactivate(
          params.id,
          readDeviceProofHeaders(request.headers),
          runtimeCall(request),
        );
        return signer.respond({ request, set }, 200, result.data, result);
      },
      {
        response: { 200: "deactivation.result" },
        detail: { summary: "Deactivate this device (device proof)", security: [{ deviceProof: [] }] },
      },
    );
