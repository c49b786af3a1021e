import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { PageQuery } from "../../http/pagination.ts";
import { parseIfMatch } from "../../http/preconditions.ts";
import { noContent } from "../../http/respond.ts";
import { NoEtagIfMatchHeaders } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { presentActivation } from "./management-service.ts";
import { activationModels } from "./model.ts";

export const managementActivationsController = ({ activationAdmin, pages }: Services) =>
  new Elysia({ prefix: "/mgmt/v1", detail: { tags: ["Activations"] } })
    .use(managementAuth)
    .model(activationModels)
    .get(
      "/licenses/:id/activations",
      ({ caller, params, query }) => {
        const page = pages.newestFirst(query, {
          route: "/mgmt/v1/licenses/:id/activations",
          idPrefix: "act",
          environment: caller.environment,
          filters: { id: params.id },
        });
        return page.present(
          activationAdmin.listForLicense(params.id, caller.environment, page),
          presentActivation,
        );
      },
      {
        scope: "licenses:read",
        query: PageQuery,
        response: { 200: "activation.list" },
        detail: { summary: "Devices activated on a license, newest first" },
      },
    )
    .get(
      "/activations/:id",
      ({ caller, params }) => ({
        data: activationAdmin.detail(activationAdmin.get(params.id, caller.environment)),
      }),
      {
        scope: "licenses:read",
        response: { 200: "activation.response" },
        detail: { summary: "One activation with its check-in state" },
      },
    )
    .delete(
      "/activations/:id",
      ({ caller, params, headers, request }) => {
        activationAdmin.forceDeactivate(
          params.id,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        return noContent();
      },
      {
        scope: "activations:delete",
        headers: NoEtagIfMatchHeaders,
        detail: { summary: "Force-deactivate a device" },
      },
    );
