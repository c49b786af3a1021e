import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { postOnce } from "../../http/idempotency.ts";
import { PageQuery } from "../../http/pagination.ts";
import { parseIfMatch, versionEtag } from "../../http/preconditions.ts";
import { noContent } from "../../http/respond.ts";
import { IfMatchHeaders, RequiredIdempotencyHeaders, WithEtag } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { productModels } from "./model.ts";
import { presentProduct } from "./service.ts";

const ROUTE = "/mgmt/v1/products";

export const productsController = ({ products, idempotency, pages }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Products"] } })
    .use(managementAuth)
    .model(productModels)
    .get(
      "",
      ({ caller, query }) => {
        const page = pages.newestFirst(query, {
          route: ROUTE,
          idPrefix: "prod",
          environment: caller.environment,
        });
        return page.present(products.list(caller.environment, page), presentProduct);
      },
      {
        scope: "products:read",
        query: PageQuery,
        response: { 200: "product.list" },
        detail: { summary: "List products" },
      },
    )
    .post(
      "",
      ({ caller, body, headers, request }) =>
        postOnce(idempotency, ROUTE, { caller, headers, body }, () => {
          const row = products.create(body, changeContext(caller, request));
          return {
            status: 201,
            body: { data: presentProduct(row) },
            headers: { etag: versionEtag(row.version) },
          };
        }),
      {
        scope: "products:write",
        body: "product.create",
        headers: RequiredIdempotencyHeaders,
        response: { 201: "product.response" },
        detail: { summary: "Create a product", responses: { 201: WithEtag } },
      },
    )
    .get(
      "/:id",
      ({ caller, params, set }) => {
        const row = products.get(params.id, caller.environment);
        set.headers.etag = versionEtag(row.version);
        return { data: presentProduct(row) };
      },
      {
        scope: "products:read",
        response: { 200: "product.response" },
        detail: { summary: "Get a product", responses: { 200: WithEtag } },
      },
    )
    .patch(
      "/:id",
      ({ caller, params, body, headers, request, set }) => {
        const row = products.update(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = versionEtag(row.version);
        return { data: presentProduct(row) };
      },
      {
        scope: "products:write",
        body: "product.update",
        headers: IfMatchHeaders,
        response: { 200: "product.response" },
        detail: { summary: "Update a product (If-Match: version)", responses: { 200: WithEtag } },
      },
    )
    .delete(
      "/:id",
      ({ caller, params, headers, request }) => {
        products.archive(params.id, parseIfMatch(headers["if-match"]), changeContext(caller, request));
        return noContent();
      },
      {
        scope: "products:write",
        headers: IfMatchHeaders,
        detail: { summary: "Archive a product (If-Match: version)" },
      },
    );
