import { Elysia } from "elysia";
import { answerAfterFloor } from "../../http/answer-floor.ts";
import { runtimeCall } from "../../http/runtime-call.ts";
import { errorEnvelopeResponse, RequiredIdempotencyHeaders } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { checkMachineSignalNames } from "../activations/model.ts";
import { trialModels } from "./model.ts";

const ROUTE = "/runtime/v1/trial-verifications";

/** Trial sign-up by email code (spec §4.2 rules 9-12): start, then confirm with a device proof. */
export const trialVerificationsController = ({ trials, signer }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Runtime"], security: [] } })
    .model(trialModels)
    .post(
      "",
      ({ body, request, set }) =>
        answerAfterFloor(() => {
          const result = trials.start(body);
          return signer.respond({ request, set }, 202, result.data, result);
        }),
      {
        body: "trial-verification.start",
        response: { 202: "trial-verification.started" },
        detail: {
          summary:
            "Start a trial sign-up: mails a six-digit code when the product accepts sign-ups and the send limits allow; the same 202 either way",
          responses: { 404: errorEnvelopeResponse("NOT_FOUND: no product has this product_id.") },
        },
      },
    )
    .post(
      "/:id/confirm",
      async ({ params, body, headers, request, set }) => {
        checkMachineSignalNames(body.machine_signals);
        const { outcome, productId } = await trials.confirm(
          params.id,
          body,
          headers["idempotency-key"],
          runtimeCall(request),
        );
        // Stored unsigned: a replay is signed afresh for this request's nonce (DESIGN §4).
        const response = signer.respond({ request, set }, outcome.status, outcome.value, {
          productId,
          nonce: body.nonce,
        });
        if (outcome.replayed) response.headers.set("idempotent-replayed", "true");
        return response;
      },
      {
        body: "trial-verification.confirm",
        headers: RequiredIdempotencyHeaders,
        response: { 201: "trial-verification.result" },
        detail: {
          summary:
            "Confirm a trial sign-up with the emailed code and a Service-Trial-Proof-v1 device proof: issues (or joins) the trial license and activates the device",
          responses: {
            401: errorEnvelopeResponse(
              "EMAIL_VERIFICATION_CODE_INVALID (details.remaining_attempts), DEVICE_PROOF_INVALID or CLOCK_SKEW.",
            ),
            403: errorEnvelopeResponse(
              "TRIAL_ALREADY_USED, TRIAL_ACTIVATION_INVALID (details.reason), PLAN_ENTITLEMENT_REQUIRED, LICENSE_*.",
            ),
            409: errorEnvelopeResponse(
              "PLAN_QUOTA_EXCEEDED, MACHINE_LIMIT_REACHED, DEVICE_KEY_MISMATCH or IDEMPOTENCY_CONFLICT.",
            ),
            410: errorEnvelopeResponse(
              "EMAIL_VERIFICATION_EXPIRED: expired, used, out of attempts or unknown.",
            ),
          },
        },
      },
    );
