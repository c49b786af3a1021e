import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { postOnce } from "../../http/idempotency.ts";
import { PageQuery, pageRequest, splitPage, toPage } from "../../http/pagination.ts";
import { json, noContent } from "../../http/respond.ts";
import { IdempotencyHeaders } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { presentDelivery } from "./deliveries.ts";
import { DeliveryListQuery, webhookModels } from "./model.ts";

const ROUTE = "/mgmt/v1/webhooks";

/**
 * rotate-secret's body is optional (docs/api.md). The shared JSON parser runs first and answers
 * for any body that was sent; this parser is asked only when there were no bytes at all, and makes
 * that `{}`, so the defaults apply and a body that is sent is still validated (`null`, `[]` are 422).
 */
const noBodyMeansDefaults = () => ({});

/** Webhook endpoints (spec §4.3), their secret rotation and their delivery log (docs/api.md "Webhooks"). */
export const webhooksController = ({ webhooks, webhookDeliveries, idempotency }: Services) =>
  new Elysia({ prefix: ROUTE, detail: { tags: ["Webhooks"] } })
    .use(managementAuth)
    .model(webhookModels)
    .get(
      "",
      ({ query }) => {
        const page = pageRequest(query, "whk");
        return toPage(webhooks.list(page), page.limit, (row) => webhooks.present(row));
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
            return { status: 201, body: { data: { ...webhooks.present(row), secret } } };
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
            "A repeat with the same Idempotency-Key and body replays this response, secret included, and creates nothing.",
        },
      },
    )
    .get("/:id", ({ params }) => ({ data: webhooks.present(webhooks.get(params.id)) }), {
      scope: "webhooks:read",
      response: { 200: "webhook.response" },
      detail: { summary: "Get a webhook endpoint (no secret; no URL for team-chat destinations)" },
    })
    .patch(
      "/:id",
      ({ caller, params, body, request }) => ({
        data: webhooks.present(webhooks.update(params.id, body, changeContext(caller, request))),
      }),
      {
        scope: "webhooks:write",
        body: "webhook.update",
        response: { 200: "webhook.response" },
        detail: { summary: "Change a webhook endpoint's name, URL or events, or re-enable it" },
      },
    )
    .delete(
      "/:id",
      ({ caller, params, request }) => {
        webhooks.stop(params.id, changeContext(caller, request));
        return noContent();
      },
      { scope: "webhooks:write", detail: { summary: "Stop a webhook endpoint for good" } },
    )
    .post(
      "/:id/rotate-secret",
      ({ caller, params, body, request }) => {
        const { row, secret } = webhooks.rotateSecret(
          params.id,
          body?.overlap_sec,
          changeContext(caller, request),
        );
        return json(200, { data: { ...webhooks.present(row), secret } });
      },
      {
        scope: "webhooks:write",
        body: "webhook.rotate",
        parse: noBodyMeansDefaults,
        response: { 200: "webhook.created" },
        detail: {
          "x-body-optional": true,
          summary: "Rotate the signing secret; the new one is in this response only",
          description:
            "Both secrets sign every delivery until secret_rotation.activates_at (overlap_sec, default one day).",
        },
      },
    )
    .get(
      "/:id/deliveries",
      ({ caller, params, query }) => {
        const page = pageRequest(query, "whd");
        const rows = webhookDeliveries.list(params.id, caller.environment, page, query.status);
        const split = splitPage(rows, page.limit);
        return { data: split.rows.map(presentDelivery), pagination: split.pagination };
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
