import { Type } from "@sinclair/typebox";
import { Elysia, t } from "elysia";
import { parseDateTime } from "../../domain/datetime.ts";
import { managementAuth } from "../../http/auth.ts";
import { ApiError } from "../../http/errors.ts";
import { pageParams } from "../../http/pagination.ts";
import { DateTime, errorEnvelopeResponse, listOf, Nullable } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { presentRuntimeEvent } from "./service.ts";

const Entry = Type.Object({
  operation: Type.String(),
  outcome: Type.Literal("rejected"),
  code: Type.String(),
  http_status: Type.Integer(),
  occurrences: Type.Integer(),
  first_occurred_at: DateTime(),
  last_occurred_at: DateTime(),
  last_request_id: Type.String(),
  product_id: Nullable(Type.String()),
  license_id: Nullable(Type.String()),
  activation_id: Nullable(Type.String()),
  details_omitted: Type.Boolean(),
});

export const runtimeEventsController = ({
  runtimeEvents,
  licenses,
  products,
  activationAdmin,
  pages,
}: Services) =>
  new Elysia({ prefix: "/mgmt/v1/runtime_events", detail: { tags: ["Activations"] } })
    .use(managementAuth)
    .model({ "runtime-event.list": listOf(Entry) })
    .get(
      "",
      ({ caller, query }) => {
        // A filter naming something this key cannot see is a 404, not an empty list.
        if (query.license_id) licenses.get(query.license_id, caller.environment);
        if (query.product_id) products.get(query.product_id, caller.environment);
        if (query.activation_id) activationAdmin.get(query.activation_id, caller.environment);
        let since: Date | undefined;
        if (query.since !== undefined) {
          since = parseDateTime(query.since) ?? undefined;
          if (!since)
            throw new ApiError(
              "INVALID_REQUEST",
              "since must be an RFC 3339 date-time with a real calendar date, e.g. 2030-01-31T00:00:00Z.",
            );
        }
        const page = pages.oldestFirst(query, {
          route: "/mgmt/v1/runtime_events",
          idPrefix: "evt",
          environment: caller.environment,
          filters: {
            license_id: query.license_id,
            activation_id: query.activation_id,
            product_id: query.product_id,
            since: query.since,
          },
        });
        const rows = runtimeEvents.list(
          caller.environment,
          {
            licenseId: query.license_id,
            activationId: query.activation_id,
            productId: query.product_id,
            since,
          },
          page,
        );
        return page.present(rows, presentRuntimeEvent);
      },
      {
        scope: "licenses:read",
        query: t.Object({
          ...pageParams,
          license_id: t.Optional(t.String({ maxLength: 64 })),
          activation_id: t.Optional(t.String({ maxLength: 64 })),
          product_id: t.Optional(t.String({ maxLength: 64 })),
          since: t.Optional(
            t.String({ maxLength: 64, description: "ISO 8601; entries last seen at or after it." }),
          ),
        }),
        response: { 200: "runtime-event.list" },
        detail: {
          summary: "Rejected runtime requests of the last 7 days, oldest first",
          responses: {
            404: errorEnvelopeResponse(
              "NOT_FOUND: the license, product or activation a filter names does not exist for this key.",
            ),
          },
        },
      },
    );
