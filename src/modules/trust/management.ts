import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { dataOf, errorEnvelopeResponse, JsonObject } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";

const IntegrationConfig = Type.Object({
  file_name: Type.Literal("service.config.json"),
  content: Type.String({ description: "The file, ready to save: the JSON of `config`." }),
  config: JsonObject("service_config_version, trust_anchor, product, entitlements, … (docs/protocol.md)."),
});

export const integrationConfigController = ({ integrationConfig }: Services) =>
  new Elysia({ prefix: "/mgmt/v1/products", detail: { tags: ["Products"] } })
    .use(managementAuth)
    .model({ "integration-config.response": dataOf(IntegrationConfig) })
    .get(
      "/:id/integration-config",
      ({ caller, params }) => ({ data: integrationConfig.build(params.id, caller.environment) }),
      {
        scope: "products:read",
        response: { 200: "integration-config.response" },
        detail: {
          summary: "The service.config.json the app embeds (409 for an archived product)",
          responses: {
            409: errorEnvelopeResponse("PRODUCT_ARCHIVED: an archived product gets no new installs."),
          },
        },
      },
    );
