import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { parseIfMatch, versionEtag } from "../../http/preconditions.ts";
import { errorEnvelopeResponse, IfMatchHeaders, WithEtag } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { trialSignupModels } from "./trial-signup-model.ts";

/** Trial sign-up settings of a product (spec §4.3 rule 3). */
export const trialSignupController = ({ trialSignups }: Services) =>
  new Elysia({ prefix: "/mgmt/v1/products", detail: { tags: ["Products"] } })
    .use(managementAuth)
    .model(trialSignupModels)
    .get(
      "/:id/trial-signup",
      ({ caller, params, set }) => {
        const data = trialSignups.get(params.id, caller.environment);
        set.headers.etag = versionEtag(data.version);
        return { data };
      },
      {
        scope: "products:read",
        response: { 200: "trial-signup.response" },
        detail: {
          summary: "Trial sign-up settings (409 for an archived product)",
          responses: { 200: WithEtag, 409: errorEnvelopeResponse("PRODUCT_ARCHIVED.") },
        },
      },
    )
    .patch(
      "/:id/trial-signup",
      ({ caller, params, body, headers, request, set }) => {
        const data = trialSignups.update(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = versionEtag(data.version);
        return { data };
      },
      {
        scope: "products:write",
        body: "trial-signup.patch",
        headers: IfMatchHeaders,
        response: { 200: "trial-signup.response" },
        detail: {
          summary: "Change trial sign-up settings (If-Match: the product's version)",
          responses: {
            200: WithEtag,
            403: errorEnvelopeResponse(
              "INSUFFICIENT_SCOPE, or PLAN_ENTITLEMENT_REQUIRED (details.entitlement: trial_licenses) when choosing a policy.",
            ),
            409: errorEnvelopeResponse("VERSION_CONFLICT or PRODUCT_ARCHIVED."),
          },
        },
      },
    );
