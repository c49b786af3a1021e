import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { postOnce } from "../../http/idempotency.ts";
import { PageQuery } from "../../http/pagination.ts";
import { parseIfMatch } from "../../http/preconditions.ts";
import { json, noContent } from "../../http/respond.ts";
import { IdempotencyHeaders, IfMatchHeaders, WithEtag } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { presentDelivery } from "./deliveries.ts";
import { DeliveryListQuery, webhookModels } from "./model.ts";
import { webhookEtag } from "./service.ts";

const ROUTE = "/mgmt/v1/webhooks";

/**
 * rotate-secret's body is optional (docs/api.md). The shared JSON parser runs first and answers
 * for any body that was sent; this parser is asked only when there were no bytes at all, and makes
 * that `{}`, so the defaults apply and a body that is sent is still validated (`null`, `[]` are 422).
 */
const noBodyMeansDefaults = () => ({});

/** Webhook endpoints (spec §4.3), their secret rotation and their delivery log (docs/api.md "Webhooks"). */
export const webhooksController = ({ webhooks, webhookDeliveries, idempotency, pages }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Webhooks"] } })
    .use(managementAuth)
    .model(webhookModels)
    .get(
      "",
      ({ caller, query }) => {
        const page = pages.newestFirst(query, {
          route: ROUTE,
          idPrefix: "whk",
          environment: caller.environment,
        });
        return page.present(webhooks.list(page), (row) => webhooks.present(row));
      },
      {
        scope: "webhooks:read",
        query: PageQuery,
        response: { 200: "webhook.list" },
        detail: { summary: "List webhook endpoints (shared by live and test; secrets never shown)" },
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
            const { row, secret } = webhooks.create(body, changeContext(caller, request));
            return {
              status: 201,
              body: { data: { ...webhooks.present(row), secret } },
              headers: { etag: webhookEtag(row) },
            };
          },
          { required: false },
        ),
      {
        scope: "webhooks:write",
        body: "webhook.create",
        headers: IdempotencyHeaders,
        response: { 201: "webhook.created" },
        detail: {
          summary: "Create a webhook endpoint; the signing secret is in this response only",
          description:
            "A repeat with the same Idempotency-Key and body replays this response, secret included, and creates nothing. A plan without the webhooks feature: 403 PLAN_ENTITLEMENT_REQUIRED (details.entitlement: webhooks).",
          responses: { 201: WithEtag },
        },
      },
    )
    .get(
      "/:id",
      ({ params, set }) => {
        const row = webhooks.get(params.id);
        set.headers.etag = webhookEtag(row);
        return { data: webhooks.present(row) };
      },
      {
        scope: "webhooks:read",
        response: { 200: "webhook.response" },
        detail: {
          summary: "Get a webhook endpoint (ETag; no secret; no URL for team-chat destinations)",
          responses: { 200: WithEtag },
        },
      },
    )
    .patch(
      "/:id",
      ({ caller, params, body, headers, request, set }) => {
        const row = webhooks.update(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = webhookEtag(row);
        return { data: webhooks.present(row) };
      },
      {
        scope: "webhooks:write",
        body: "webhook.update",
        headers: IfMatchHeaders,
        response: { 200: "webhook.response" },
        detail: {
          summary: "Change a webhook endpoint's name, URL or events, or re-enable it (If-Match: the ETag)",
          description:
            "A plan without the webhooks feature may rename an endpoint only: a new URL, events or re-enabling is 403 PLAN_ENTITLEMENT_REQUIRED.",
          responses: { 200: WithEtag },
        },
      },
    )
    .delete(
      "/:id",
      ({ caller, params, headers, request }) => {
        webhooks.stop(params.id, parseIfMatch(headers["if-match"]), changeContext(caller, request));
        return noContent();
      },
      {
        scope: "webhooks:write",
        headers: IfMatchHeaders,
        detail: { summary: "Stop a webhook endpoint for good (If-Match: the ETag)" },
      },
    )
    .post(
      "/:id/rotate-secret",
      ({ caller, params, body, headers, request }) => {
        const { row, secret } = webhooks.rotateSecret(
          params.id,
          body?.overlap_sec,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        return json(200, { data: { ...webhooks.present(row), secret } }, { etag: webhookEtag(row) });
      },
      {
        scope: "webhooks:write",
        body: "webhook.rotate",
        parse: noBodyMeansDefaults,
        headers: IfMatchHeaders,
        response: { 200: "webhook.created" },
        detail: {
          "x-body-optional": true,
          summary: "Rotate the signing secret; the new one is in this response only",
          description:
            "Both secrets sign every delivery until secret_rotation.activates_at (overlap_sec, default one day).",
          responses: { 200: WithEtag },
        },
      },
    )
    .get(
      "/:id/deliveries",
      ({ caller, params, query }) => {
        const page = pages.newestFirst(query, {
          route: `${ROUTE}/:id/deliveries`,
          idPrefix: "whd",
          environment: caller.environment,
          filters: { id: params.id, status: query.status },
        });
        return page.present(
          webhookDeliveries.list(params.id, caller.environment, page, query.status),
          presentDelivery,
        );
      },
      {
        scope: "webhooks:read",
        query: DeliveryListQuery,
        response: { 200: "webhook.delivery-list" },
        detail: { summary: "The delivery log of an endpoint, newest first (this key's environment)" },
      },
    )
    .get(
      "/:id/deliveries/:delivery_id",
      ({ caller, params }) => ({
        data: webhookDeliveries.get(params.id, params.delivery_id, caller.environment),
      }),
      {
        scope: "webhooks:read",
        response: { 200: "webhook.delivery" },
        detail: { summary: "One delivery with its payload and every attempt" },
      },
    )
    .post(
      "/:id/deliveries/:delivery_id/replay",
      ({ caller, params }) => ({
        data: webhookDeliveries.replay(params.id, params.delivery_id, caller.environment),
      }),
      {
        scope: "webhooks:write",
        response: { 200: "webhook.delivery" },
        detail: { summary: "Send a finished delivery again (same message id, fresh retry schedule)" },
      },
    );
