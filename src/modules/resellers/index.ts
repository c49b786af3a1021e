import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { postOnce } from "../../http/idempotency.ts";
import { PageQuery, pageRequest, toPage } from "../../http/pagination.ts";
import { IdempotencyHeaders } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { resellerModels } from "./model.ts";
import { presentReseller } from "./service.ts";

const ROUTE = "/mgmt/v1/resellers";

export const resellersController = ({ resellers, idempotency }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Resellers"] } })
    .use(managementAuth)
    .model(resellerModels)
    .get(
      "",
      ({ query }) => {
        const page = pageRequest(query, "rsl");
        return toPage(resellers.list(page), page.limit, presentReseller);
      },
      {
        scope: "customers:read",
        query: PageQuery,
        response: { 200: "reseller.list" },
        detail: { summary: "List resellers" },
      },
    )
    .post(
      "",
      ({ caller, body, headers, request }) =>
        postOnce(
          idempotency,
          ROUTE,
          { caller, headers, body },
          () => ({
            status: 201,
            body: { data: presentReseller(resellers.create(body, changeContext(caller, request))) },
          }),
          { required: false },
        ),
      {
        scope: "customers:write",
        body: "reseller.create",
        headers: IdempotencyHeaders,
        response: { 201: "reseller.response" },
        detail: { summary: "Create a reseller (optional Idempotency-Key)" },
      },
    )
    .get("/:id", ({ params }) => ({ data: presentReseller(resellers.get(params.id)) }), {
      scope: "customers:read",
      response: { 200: "reseller.response" },
      detail: { summary: "Get a reseller" },
    })
    .patch(
      "/:id",
      ({ caller, params, body, request }) => ({
        data: presentReseller(resellers.update(params.id, body, changeContext(caller, request))),
      }),
      {
        scope: "customers:write",
        body: "reseller.update",
        response: { 200: "reseller.response" },
        detail: { summary: "Update a reseller" },
      },
    );
