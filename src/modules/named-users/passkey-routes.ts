import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { requestState } from "../../http/request-state.ts";
import { dataOf, errorEnvelopeResponse, IdField } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { APPROVE_PAGE, REGISTER_PAGE } from "./passkey-pages.ts";

const B64U = (maxLength: number) => Type.String({ minLength: 1, maxLength, pattern: "^[A-Za-z0-9_-]+$" });
const Secret = B64U(128);

const models = {
  "passkey.registration_options_request": Type.Object({ token: Secret }, { additionalProperties: false }),
  "passkey.registration_options": dataOf(
    Type.Object({
      challenge: Type.String(),
      rp_id: Type.String(),
      user_id: Type.String(),
      user_name: Type.String(),
      exclude_credentials: Type.Array(Type.String()),
    }),
  ),
  "passkey.registration": Type.Object(
    {
      token: Secret,
      credential_id: B64U(1400),
      client_data_json: B64U(4096),
      attestation_object: B64U(16_384),
    },
    { additionalProperties: false },
  ),
  "passkey.registered": dataOf(
    Type.Object({
      passkey_id: Type.String(),
      user_id: Type.String(),
      created_at: Type.String({ format: "date-time" }),
    }),
  ),
  "passkey.approval_options_request": Type.Object(
    { verification_id: IdField(), secret: Secret },
    { additionalProperties: false },
  ),
  "passkey.approval_options": dataOf(
    Type.Object({
      challenge: Type.String(),
      rp_id: Type.String(),
      allow_credentials: Type.Array(Type.String()),
    }),
  ),
  "passkey.approval": Type.Object(
    {
      verification_id: IdField(),
      secret: Secret,
      credential_id: B64U(1400),
      client_data_json: B64U(4096),
      authenticator_data: B64U(4096),
      signature: B64U(1024),
    },
    { additionalProperties: false },
  ),
  "passkey.approved": dataOf(
    Type.Object({ approval_code: Type.String(), expires_at: Type.String({ format: "date-time" }) }),
  ),
};

const htmlPage = (description: string) => ({
  description,
  content: { "text/html": { schema: { type: "string" as const } } },
});
const linkGone = errorEnvelopeResponse(
  "NOT_FOUND: the registration link is unknown, used, expired or ended.",
);
const approvalGone = errorEnvelopeResponse(
  "EMAIL_VERIFICATION_EXPIRED: the approval link is unknown or its secret wrong, or its sign-in can no longer succeed (used, replaced, expired, out of attempts, or the assignment, user, license or address changed).",
);
const approvalLocked = errorEnvelopeResponse(
  "TWO_FACTOR_LOCKED: the user's two-factor is locked; the vendor must unlock it.",
);

/**
 * The license user's side of passkeys (no API key: the secrets in the links are the credential).
 * Two HTML pages for the user's browser, and the JSON calls they make.
 */
export const passkeysController = ({ passkeys }: Services) =>
  new Elysia({ prefix: "/passkeys/v1", detail: { tags: ["Passkeys"], security: [] } })
    .model(models)
    .get("/register", () => new Response(REGISTER_PAGE.html, { headers: REGISTER_PAGE.headers }), {
      detail: {
        summary: "HTML page: register a passkey (the link's token is in the fragment)",
        responses: { 200: htmlPage("The registration page.") },
      },
    })
    .get("/approve", () => new Response(APPROVE_PAGE.html, { headers: APPROVE_PAGE.headers }), {
      detail: {
        summary: "HTML page: approve a sign-in with a passkey (from the verification email)",
        responses: { 200: htmlPage("The approval page.") },
      },
    })
    .post("/register/options", ({ body }) => ({ data: passkeys.registrationOptions(body.token) }), {
      body: "passkey.registration_options_request",
      response: { 200: "passkey.registration_options" },
      detail: {
        summary: "WebAuthn creation options for a registration link",
        responses: { 404: linkGone },
      },
    })
    .post(
      "/register",
      ({ body, request, set }) => {
        set.status = 201;
        return { data: passkeys.register(body, requestState.get(request)?.requestId ?? null) };
      },
      {
        body: "passkey.registration",
        response: { 201: "passkey.registered" },
        detail: {
          summary: "Register the passkey created in the browser (single-use link)",
          responses: {
            400: errorEnvelopeResponse(
              "INVALID_REQUEST: malformed, or no options were asked for this link first.",
            ),
            404: linkGone,
            422: errorEnvelopeResponse(
              "VALIDATION_FAILED (the attestation does not verify, or the passkey is registered already) or INVALID_TRANSITION (the user has 10 passkeys).",
            ),
          },
        },
      },
    )
    .post(
      "/approve/options",
      ({ body }) => ({ data: passkeys.approvals.approvalOptions(body.verification_id, body.secret) }),
      {
        body: "passkey.approval_options_request",
        response: { 200: "passkey.approval_options" },
        detail: {
          summary: "WebAuthn request options for a verification's approval link",
          responses: { 403: approvalLocked, 410: approvalGone },
        },
      },
    )
    .post("/approve", ({ body }) => ({ data: passkeys.approvals.approve(body) }), {
      body: "passkey.approval",
      response: { 200: "passkey.approved" },
      detail: {
        summary:
          "Approve a sign-in with a passkey: the verification's approval code for second_factor_code (the same at every approval)",
        responses: {
          400: errorEnvelopeResponse(
            "INVALID_REQUEST: malformed, or no options were asked for this verification first.",
          ),
          401: errorEnvelopeResponse(
            "TWO_FACTOR_INVALID: the passkey assertion did not verify (details.reason).",
          ),
          403: approvalLocked,
          410: approvalGone,
        },
      },
    });
