import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { emailField } from "../../http/email-field.ts";
import { postOnce } from "../../http/idempotency.ts";
import { parseIfMatch } from "../../http/preconditions.ts";
import { noContent } from "../../http/respond.ts";
import { IfMatchHeaders, RequiredIdempotencyHeaders, WithEtag } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { CustomerListQuery, customerModels } from "./model.ts";
import { customerEtag, presentCustomer } from "./service.ts";

const ROUTE = "/mgmt/v1/customers";

export const customersController = ({ customers, idempotency, pages }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Customers"] } })
    .use(managementAuth)
    .model(customerModels)
    .get(
      "",
      ({ caller, query }) => {
        const page = pages.newestFirst(query, {
          route: ROUTE,
          idPrefix: "cus",
          environment: caller.environment,
          filters: { email: query.email },
        });
        return page.present(customers.list(page, query.email), presentCustomer);
      },
      {
        scope: "customers:read",
        query: CustomerListQuery,
        response: { 200: "customer.list" },
        detail: { summary: "List customers (shared by live and test)" },
      },
    )
    .post(
      "",
      ({ caller, body, headers, request }) => {
        // The schema's pattern is a first filter; this is the full check (an IDN must convert).
        if (body.email) emailField(body.email);
        return postOnce(idempotency, ROUTE, { caller, headers, body }, () => {
          const row = customers.create(body, changeContext(caller, request));
          return { status: 201, body: { data: presentCustomer(row) }, headers: { etag: customerEtag(row) } };
        });
      },
      {
        scope: "customers:write",
        body: "customer.create",
        headers: RequiredIdempotencyHeaders,
        response: { 201: "customer.response" },
        detail: { summary: "Create a customer (name or email required)", responses: { 201: WithEtag } },
      },
    )
    .get(
      "/:id",
      ({ params, set }) => {
        const row = customers.get(params.id);
        set.headers.etag = customerEtag(row);
        return { data: presentCustomer(row) };
      },
      {
        scope: "customers:read",
        response: { 200: "customer.response" },
        detail: { summary: "Get a customer (ETag)", responses: { 200: WithEtag } },
      },
    )
    .patch(
      "/:id",
      ({ caller, params, body, headers, request, set }) => {
        if (body.email) emailField(body.email);
        const row = customers.update(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = customerEtag(row);
        return { data: presentCustomer(row) };
      },
      {
        scope: "customers:write",
        body: "customer.update",
        headers: IfMatchHeaders,
        response: { 200: "customer.response" },
        detail: {
          summary: "Update a customer (If-Match: the ETag, unchanged)",
          responses: { 200: WithEtag },
        },
      },
    )
    .delete(
      "/:id",
      ({ caller, params, headers, request }) => {
        customers.archive(params.id, parseIfMatch(headers["if-match"]), changeContext(caller, request));
        return noContent();
      },
      {
        scope: "customers:write",
        headers: IfMatchHeaders,
        detail: { summary: "Archive a customer (If-Match: the ETag, unchanged)" },
      },
    );
