import { Elysia } from "elysia";
import { readDeviceProofHeaders } from "../../http/device-proof.ts";
import { runtimeCall } from "../../http/runtime-call.ts";
import { errorEnvelopeResponse } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { leaseModels } from "./model.ts";

const proofSecurity = { security: [{ deviceProof: [] }] };

export const leasesController = ({ leases, signer }: Services) =>
  new Elysia({ prefix: "/runtime/v1/leases", detail: { tags: ["Runtime"] } })
    .model(leaseModels)
    .post(
      "",
      async ({ body, request, set }) => {
        const result = await leases.acquire(
          body,
          readDeviceProofHeaders(request.headers),
          runtimeCall(request),
        );
        return signer.respond({ request, set }, 201, result.data, result);
      },
      {
        body: "lease.create",
        response: { 201: "lease.result" },
        detail: {
          summary: "Take a floating seat",
          ...proofSecurity,
          responses: {
            409: errorEnvelopeResponse(
              "CONCURRENCY_LIMIT_REACHED: every seat is taken; retry later, or release one.",
            ),
          },
        },
      },
    )
    .post(
      "/:id/heartbeat",
      async ({ params, body, request, set }) => {
        const result = await leases.heartbeat(
          params.id,
          body.instance_id,
          readDeviceProofHeaders(request.headers),
          runtimeCall(request),
        );
        return signer.respond({ request, set }, 200, result.data, result);
      },
      {
        body: "lease.instance",
        response: { 200: "lease.result" },
        detail: { summary: "Keep a seat", ...proofSecurity },
      },
    )
    .delete(
      "/:id",
      async ({ params, body, request, set }) => {
        const result = await leases.release(
          params.id,
          body.instance_id,
          readDeviceProofHeaders(request.headers),
          runtimeCall(request),
        );
        return signer.respond({ request, set }, 200, result.data, result);
      },
      {
        body: "lease.instance",
        response: { 200: "lease.released" },
        detail: { summary: "Release a seat", ...proofSecurity },
      },
    );
