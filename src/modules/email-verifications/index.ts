import { Elysia } from "elysia";
import { answerAfterFloor } from "../../http/answer-floor.ts";
import { errorEnvelopeResponse } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { emailVerificationModels } from "./model.ts";

const ROUTE = "/runtime/v1/email-verifications";

/** Email verification for named-user licenses (no authentication; spec §5.2). Both answers are signed. */
export const emailVerificationsController = ({ emailVerifications, signer }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Runtime"], security: [] } })
    .model(emailVerificationModels)
    .post(
      "",
      ({ body, request, set }) =>
        answerAfterFloor(() => {
          const result = emailVerifications.start(body);
          return signer.respond({ request, set }, 202, result.data, {
            productId: result.productId,
            nonce: body.nonce,
          });
        }),
      {
        body: "email_verification.start",
        response: { 202: "email_verification.start_result" },
        detail: {
          summary: "Send a sign-in code to a named user (the same 202 whether or not a code was sent)",
          responses: {
            403: errorEnvelopeResponse(
              "PLAN_ENTITLEMENT_REQUIRED (details.entitlement: email_license_verification).",
            ),
            404: errorEnvelopeResponse("NOT_FOUND: no such product."),
          },
        },
      },
    )
    .post(
      "/:verification_id/confirm",
      ({ params, body, request, set }) => {
        const result = emailVerifications.confirm(params.verification_id, body);
        return signer.respond({ request, set }, 200, result.data, {
          productId: result.productId,
          nonce: body.nonce,
        });
      },
      {
        body: "email_verification.confirm",
        response: { 200: "named_user_token.result" },
        detail: {
          summary: "Exchange the emailed code (and second factor) for a single-use named-user token",
          responses: {
            401: errorEnvelopeResponse(
              "EMAIL_VERIFICATION_CODE_INVALID, TWO_FACTOR_REQUIRED or TWO_FACTOR_INVALID (each with details.remaining_attempts).",
            ),
            403: errorEnvelopeResponse(
              "PLAN_ENTITLEMENT_REQUIRED, NAMED_USER_ASSIGNMENT_UNAVAILABLE or TWO_FACTOR_LOCKED.",
            ),
            410: errorEnvelopeResponse(
              "EMAIL_VERIFICATION_EXPIRED: expired, used, replaced, out of attempts, past the wrong-code budget, or unknown.",
            ),
          },
        },
      },
    );
