import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { parseIfMatch, versionEtag } from "../../http/preconditions.ts";
import { errorEnvelopeResponse, IfMatchHeaders, WithEtag } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { browserRuntimeModels } from "./browser-runtime-model.ts";

/** Browser runtime settings of a product (spec §4.3 rule 2); the CORS they drive is src/http/cors.ts. */
export const browserRuntimeController = ({ browserRuntime }: Services) =>
  new Elysia({ prefix: "/mgmt/v1/products", detail: { tags: ["Products"] } })
    .use(managementAuth)
    .model(browserRuntimeModels)
    .get(
      "/:id/browser-runtime",
      ({ caller, params, set }) => {
        const settings = browserRuntime.get(params.id, caller.environment);
        set.headers.etag = versionEtag(settings.version);
        return { data: settings };
      },
      {
        scope: "products:read",
        response: { 200: "browser-runtime.response" },
        detail: {
          summary:
            "Browser runtime settings: whether browsers may call the Runtime API, and from which origins",
          responses: { 200: WithEtag, 409: errorEnvelopeResponse("PRODUCT_ARCHIVED.") },
        },
      },
    )
    .patch(
      "/:id/browser-runtime",
      ({ caller, params, body, headers, request, set }) => {
        const settings = browserRuntime.update(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = versionEtag(settings.version);
        return { data: settings };
      },
      {
        scope: "products:write",
        body: "browser-runtime.update",
        headers: IfMatchHeaders,
        response: { 200: "browser-runtime.response" },
        detail: {
          summary: "Change the browser runtime settings (If-Match: the product's version)",
          responses: {
            200: WithEtag,
            403: errorEnvelopeResponse(
              "INSUFFICIENT_SCOPE, or PLAN_ENTITLEMENT_REQUIRED (details.entitlement: browser_runtime) when enabling.",
            ),
            409: errorEnvelopeResponse(
              "VERSION_CONFLICT (stale If-Match; nothing changed), or PRODUCT_ARCHIVED.",
            ),
            422: errorEnvelopeResponse("VALIDATION_FAILED: details.errors keyed by allowed_origins.<index>."),
          },
        },
      },
    );
