import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { postOnce } from "../../http/idempotency.ts";
import { parseIfMatch } from "../../http/preconditions.ts";
import { noContent } from "../../http/respond.ts";
import { IfMatchHeaders, RequiredIdempotencyHeaders, WithEtag } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { PolicyListQuery, policyModels } from "./model.ts";
import { policyEtag, presentPolicy } from "./service.ts";

const ROUTE = "/mgmt/v1/policies";

export const policiesController = ({ policies, idempotency, pages }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Policies"] } })
    .use(managementAuth)
    .model(policyModels)
    .get(
      "",
      ({ caller, query }) => {
        const page = pages.newestFirst(query, {
          route: ROUTE,
          idPrefix: "pol",
          environment: caller.environment,
          filters: { product_id: query.product_id },
        });
        return page.present(policies.list(caller.environment, page, query.product_id), presentPolicy);
      },
      {
        scope: "policies:read",
        query: PolicyListQuery,
        response: { 200: "policy.list" },
        detail: { summary: "List policies" },
      },
    )
    .post(
      "",
      ({ caller, body, headers, request }) =>
        postOnce(idempotency, ROUTE, { caller, headers, body }, () => {
          const row = policies.create(body, changeContext(caller, request));
          return { status: 201, body: { data: presentPolicy(row) }, headers: { etag: policyEtag(row) } };
        }),
      {
        scope: "policies:write",
        body: "policy.create",
        headers: RequiredIdempotencyHeaders,
        response: { 201: "policy.response" },
        detail: {
          summary: "Create a policy (only product_id and name are required)",
          responses: { 201: WithEtag },
        },
      },
    )
    .get(
      "/:id",
      ({ caller, params, set }) => {
        const row = policies.get(params.id, caller.environment);
        set.headers.etag = policyEtag(row);
        return { data: presentPolicy(row) };
      },
      {
        scope: "policies:read",
        response: { 200: "policy.response" },
        detail: { summary: "Get a policy (ETag)", responses: { 200: WithEtag } },
      },
    )
    .patch(
      "/:id",
      ({ caller, params, body, headers, request, set }) => {
        const row = policies.update(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = policyEtag(row);
        return { data: presentPolicy(row) };
      },
      {
        scope: "policies:write",
        body: "policy.update",
        headers: IfMatchHeaders,
        response: { 200: "policy.response" },
        detail: { summary: "Update a policy (If-Match: the ETag, unchanged)", responses: { 200: WithEtag } },
      },
    )
    .delete(
      "/:id",
      ({ caller, params, headers, request }) => {
        policies.retire(params.id, parseIfMatch(headers["if-match"]), changeContext(caller, request));
        return noContent();
      },
      {
        scope: "policies:write",
        headers: IfMatchHeaders,
        detail: { summary: "Retire a policy (If-Match: the ETag, unchanged)" },
      },
    );
