import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { isBillingWebhookPath } from "../../http/body.ts";
import { routedHook } from "../../http/request-path.ts";
import { requestState } from "../../http/request-state.ts";
import { errorEnvelopeResponse } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { CLAIM_PAGE } from "./claim-page.ts";
import { billingModels, billingPublicModels } from "./model.ts";
import { CLAIM_PATH, CLAIM_REDEEM_PATH, isClaimRedeemPath, WEBHOOK_PATH } from "./service.ts";

/** `GET /mgmt/v1/billing-integration` (spec §4.3): the status for the key's environment. */
export const billingIntegrationController = ({ billing }: Services) =>
  new Elysia({ prefix: "/mgmt/v1", detail: { tags: ["Billing"] } })
    .use(managementAuth)
    .model(billingModels)
    .get("/billing-integration", ({ caller }) => ({ data: billing.status(caller.environment) }), {
      scope: "products:read",
      response: { 200: "billing-integration.response" },
      detail: {
        summary:
          "Billing provider integration status for the key's environment (the restricted key and the webhook signing secret are never returned)",
      },
    });

const ProviderEvent = Type.Record(Type.String({ maxLength: 255 }), Type.Unknown(), {
  description: "The provider's event, verified byte for byte against Stripe-Signature.",
});

/**
 * The provider's webhook receiver and the buyer's claim page: no API key; the receiver is
 * authenticated by the provider's signature, a claim by its single-use token.
 */
export const billingPublicController = ({ billingWebhooks, billingClaims }: Services) =>
  new Elysia({ prefix: "", detail: { tags: ["Billing"], security: [] } })
    // Before the body is read (conventions.ts parses it): see BillingWebhookReceiver.admit.
    .onRequest(
      routedHook(({ request, set, path }) => {
        if (request.method !== "POST") return;
        if (isBillingWebhookPath(path)) billingWebhooks.admit(request.headers.get("stripe-signature"));
        // Before the body is read, so every answer carries it: a refusal of a malformed or
        // invalid body never reaches the handler, and no cache should keep any answer of a call
        // whose success carries a license key.
        else if (isClaimRedeemPath(path)) set.headers["cache-control"] = "no-store";
      }),
    )
    .model(billingPublicModels)
    .post(
      WEBHOOK_PATH,
      async ({ body, request }) => {
        const state = requestState.get(request);
        const receipt = await billingWebhooks.receive({
          rawBody: state?.rawBody,
          signature: request.headers.get("stripe-signature"),
          body,
          requestId: state?.requestId ?? null,
        });
        return { data: receipt };
      },
      {
        body: ProviderEvent,
        headers: Type.Object({
          "stripe-signature": Type.Optional(
            Type.String({ description: "t=<unix seconds>,v1=<hex HMAC-SHA256>[,v1=…]; 300 s tolerance." }),
          ),
        }),
        response: { 200: "billing-webhook.receipt" },
        detail: {
          summary:
            "Stripe webhook receiver: verifies Stripe-Signature, applies each event once (a replay answers 200 and changes nothing)",
          responses: {
            400: errorEnvelopeResponse(
              "BILLING_SIGNATURE_INVALID (missing, malformed, wrong or older than 300 s), or INVALID_REQUEST (not an event, or its mode is not the integration's).",
            ),
            403: errorEnvelopeResponse(
              "PLAN_ENTITLEMENT_REQUIRED (details.entitlement: billing_integration); the provider retries.",
            ),
            404: errorEnvelopeResponse("No billing integration is configured."),
            503: errorEnvelopeResponse(
              "SERVICE_UNAVAILABLE: the provider's API could not be read for the checkout's line items; the provider retries.",
            ),
          },
        },
      },
    )
    .get(CLAIM_PATH, () => new Response(CLAIM_PAGE.html, { headers: CLAIM_PAGE.headers }), {
      detail: {
        summary:
          "The buyer's claim page (HTML). The claim link carries the token after `#`, so it never reaches a server log.",
        responses: {
          200: { description: "The claim page.", content: { "text/html": { schema: { type: "string" } } } },
        },
      },
    })
    .post(
      CLAIM_REDEEM_PATH,
      // Cache-Control: no-store is set for every answer of this route by the onRequest hook above.
      ({ body }) => ({ data: billingClaims.redeem(body.token) }),
      {
        body: "billing-claim.request",
        response: { 200: "billing-claim.response" },
        detail: {
          summary: "Redeem a claim token: the license key, shown once",
          responses: {
            410: errorEnvelopeResponse("LICENSE_CLAIM_UNAVAILABLE: unknown, expired or already used."),
          },
        },
      },
    );
