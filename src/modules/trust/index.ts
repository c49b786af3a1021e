import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { isoSeconds, unixSeconds } from "../../domain/clock.ts";
import { ApiError } from "../../http/errors.ts";
import { dataOf, IdField } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { NONCE, signedString } from "../activations/model.ts";

const TrustBundle = Type.Object({
  bundle: Type.Object({
    v: Type.Integer(),
    product_id: Type.String(),
    environment: Type.String(),
    sequence: Type.Integer(),
    issued_at: Type.Integer(),
    root_key_id: Type.String(),
    signing_keys: Type.Array(
      Type.Object({
        key_id: Type.String(),
        public_key: Type.String(),
        status: Type.String(),
        not_before: Type.Integer(),
        not_after: Type.Union([Type.Integer(), Type.Null()]),
      }),
    ),
  }),
  root_signature: Type.String(),
});

/** The two unauthenticated trust routes: the signed key list of a product, and signed time. */
export const runtimeTrustController = ({ trust, signer, deps }: Services) => {
  // Every signed-time call asks this: prepared once.
  const productById = deps.sqlite.prepare<{ id: string }, [string]>("SELECT id FROM products WHERE id = ?");
  const productExists = (id: string) => {
    if (!productById.get(id)) throw ApiError.notFound("product");
  };
  return new Elysia({ prefix: "/runtime/v1", detail: { tags: ["Runtime"], security: [] } })
    .model({ "trust-bundle.response": dataOf(TrustBundle), "time.result": signedString() })
    .get(
      "/products/:product_id/trust-bundle",
      ({ params }) => {
        productExists(params.product_id);
        return { data: trust.bundle(params.product_id) };
      },
      {
        response: { 200: "trust-bundle.response" },
        detail: {
          summary: "The product's trust bundle, signed by the environment's root key (not an envelope)",
        },
      },
    )
    .post(
      "/time",
      ({ body, request, set }) => {
        // A product with an active key exists (the common case, answered from memory); only
        // without one is the product looked up, to tell 404 from a pending key's 409.
        if (!trust.hasActiveKey(body.product_id)) productExists(body.product_id);
        // One reading of the clock for both the data and the signed server_time.
        const now = deps.clock.now();
        return signer.respond(
          { request, set },
          200,
          isoSeconds(unixSeconds(now)),
          { productId: body.product_id, nonce: body.nonce },
          now,
        );
      },
      {
        body: Type.Object(
          {
            product_id: IdField(),
            nonce: NONCE,
            sdk_version: Type.Optional(IdField()),
          },
          { additionalProperties: false },
        ),
        response: { 200: "time.result" },
        detail: {
          summary: "Signed server time; data is the ISO 8601 form of response_assertion.server_time",
        },
      },
    );
};
