import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { postOnce } from "../../http/idempotency.ts";
import { PageQuery } from "../../http/pagination.ts";
import { parseIfMatch } from "../../http/preconditions.ts";
import { IdempotencyHeaders, IfMatchHeaders, WithEtag } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { resellerModels } from "./model.ts";
import { presentReseller, resellerEtag } from "./service.ts";

const ROUTE = "/mgmt/v1/resellers";

export const resellersController = ({ resellers, idempotency, pages }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Resellers"] } })
    .use(managementAuth)
    .model(resellerModels)
    .get(
      "",
      ({ caller, query }) => {
        const page = pages.newestFirst(query, {
          route: ROUTE,
          idPrefix: "rsl",
          environment: caller.environment,
        });
        return page.present(resellers.list(page), presentReseller);
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
          () => {
            const row = resellers.create(body, changeContext(caller, request));
            return {
              status: 201,
              body: { data: presentReseller(row) },
              headers: { etag: resellerEtag(row) },
            };
          },
          { required: false },
        ),
      {
        scope: "customers:write",
        body: "reseller.create",
        headers: IdempotencyHeaders,
        response: { 201: "reseller.response" },
        detail: { summary: "Create a reseller (optional Idempotency-Key)", responses: { 201: WithEtag } },
      },
    )
    .get(
      "/:id",
      ({ params, set }) => {
        const row = resellers.get(params.id);
        set.headers.etag = resellerEtag(row);
        return { data: presentReseller(row) };
      },
      {
        scope: "customers:read",
        response: { 200: "reseller.response" },
        detail: { summary: "Get a reseller (ETag)", responses: { 200: WithEtag } },
      },
    )
    .patch(
      "/:id",
      ({ caller, params, body, headers, request, set }) => {
        const row = resellers.update(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = resellerEtag(row);
        return { data: presentReseller(row) };
      },
      {
        scope: "customers:write",
        body: "reseller.update",
        headers: IfMatchHeaders,
        response: { 200: "reseller.response" },
        detail: { summary: "Update a reseller (If-Match: the ETag)", responses: { 200: WithEtag } },
      },
    );
