import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { ApiError } from "../../http/errors.ts";
import { errorEnvelopeResponse } from "../../http/schemas.ts";

export interface Readiness {
  ready(): boolean;
}

/**
 * /healthz answers while the process lives; /readyz once the store is open and the keystore is
 * unlocked, and no longer once shutdown has begun (so a load balancer stops sending work). Nothing
 * listens before then (server.ts), so "not ready" only ever means shutting down: during start-up
 * and its migrations, connections are refused instead.
 */
export const healthController = (readiness: Readiness) =>
  new Elysia({ detail: { tags: ["Health"] } })
    .get("/healthz", () => ({ status: "ok" as const }), {
      response: { 200: Type.Object({ status: Type.Literal("ok") }) },
      detail: { summary: "Liveness", security: [] },
    })
    .get(
      "/readyz",
      () => {
        if (!readiness.ready()) throw new ApiError("SERVICE_UNAVAILABLE", "The service is shutting down.");
        return { status: "ready" as const };
      },
      {
        response: { 200: Type.Object({ status: Type.Literal("ready") }) },
        detail: {
          summary: "Readiness",
          security: [],
          responses: { 503: errorEnvelopeResponse("SERVICE_UNAVAILABLE: the service is shutting down.") },
        },
      },
    );
