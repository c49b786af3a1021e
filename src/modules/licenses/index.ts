import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { postOnce } from "../../http/idempotency.ts";
import { parseIfMatch, versionEtag } from "../../http/preconditions.ts";
import { noContent } from "../../http/respond.ts";
import { IfMatchHeaders, RequiredIdempotencyHeaders, WithEtag } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { LicenseListQuery, licenseModels } from "./model.ts";

const ROUTE = "/mgmt/v1/licenses";

export const licensesController = ({ licenses, idempotency, pages }: Services) => {
  const one = (row: Parameters<typeof licenses.presentOne>[0]) => licenses.presentOne(row);
  return new Elysia({ prefix: ROUTE, detail: { tags: ["Licenses"] } })
    .use(managementAuth)
    .model(licenseModels)
    .get(
      "",
      ({ caller, query }) => {
        const page = pages.newestFirst(query, {
          route: ROUTE,
          idPrefix: "lic",
          environment: caller.environment,
          filters: { product_id: query.product_id, customer_id: query.customer_id },
        });
        const rows = licenses.list(caller.environment, page, {
          productId: query.product_id,
          customerId: query.customer_id,
        });
        const { rows: pageRows, pagination } = page.split(rows);
        return { data: licenses.present(pageRows), pagination };
      },
      {
        scope: "licenses:read",
        query: LicenseListQuery,
        response: { 200: "license.list" },
        detail: { summary: "List licenses" },
      },
    )
    .post(
      "",
      ({ caller, body, headers, request }) =>
        postOnce(idempotency, ROUTE, { caller, headers, body }, () => {
          const row = licenses.create(body, changeContext(caller, request));
          return { status: 201, body: { data: one(row) }, headers: { etag: versionEtag(row.version) } };
        }),
      {
        scope: "licenses:write",
        body: "license.create",
        headers: RequiredIdempotencyHeaders,
        response: { 201: "license.response" },
        detail: {
          summary: "Create a license (product_id and policy_id are required)",
          responses: { 201: WithEtag },
        },
      },
    )
    .get(
      "/:id",
      ({ caller, params, set }) => {
        const row = licenses.get(params.id, caller.environment);
        set.headers.etag = versionEtag(row.version);
        return { data: one(row) };
      },
      {
        scope: "licenses:read",
        response: { 200: "license.response" },
        detail: { summary: "Get a license", responses: { 200: WithEtag } },
      },
    )
    .patch(
      "/:id",
      ({ caller, params, body, headers, request, set }) => {
        const row = licenses.update(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = versionEtag(row.version);
        return { data: one(row) };
      },
      {
        scope: "licenses:write",
        body: "license.update",
        headers: IfMatchHeaders,
        response: { 200: "license.response" },
        detail: {
          summary: "Update a license: expiry, overrides, metadata, status_action (If-Match: version)",
          responses: { 200: WithEtag },
        },
      },
    )
    .delete(
      "/:id",
      ({ caller, params, headers, request }) => {
        licenses.revoke(params.id, parseIfMatch(headers["if-match"]), changeContext(caller, request));
        return noContent();
      },
      {
        scope: "licenses:write",
        headers: IfMatchHeaders,
        detail: { summary: "Revoke a license (terminal; If-Match: version)" },
      },
    )
    .post(
      "/:id/convert-trial",
      ({ caller, params, body, headers, request, set }) => {
        const row = licenses.convertTrial(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = versionEtag(row.version);
        return { data: one(row) };
      },
      {
        scope: "licenses:write",
        body: "license.convert-trial",
        headers: IfMatchHeaders,
        response: { 200: "license.response" },
        detail: {
          summary: "Convert a trial into a full license with the same key",
          responses: { 200: WithEtag },
        },
      },
    );
};
