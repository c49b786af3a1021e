import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { PageQuery } from "../../http/pagination.ts";
import { DateTime, JsonObject, listOf, Nullable } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { presentAuditEvent } from "./service.ts";

const AuditEvent = Type.Object({
  id: Type.String(),
  type: Type.String({
    description: "e.g. product.created, license.revoked; the catalogue is in docs/api.md.",
  }),
  request_id: Nullable(Type.String()),
  actor: JsonObject(
    "Who acted: { type: api_key, id, name } or { type: cli, id, uid } (id: the user name the command line was given; uid: its user id).",
  ),
  target: Type.Object({ type: Type.String(), id: Type.String(), environment: Type.String() }),
  data: JsonObject("What changed."),
  created_at: DateTime(),
});

export const eventsController = ({ audit, pages }: Services) =>
  new Elysia({ prefix: "/mgmt/v1/events", detail: { tags: ["Events"] } })
    .use(managementAuth)
    .model({ "event.list": listOf(AuditEvent) })
    .get(
      "",
      ({ caller, query }) => {
        const page = pages.newestFirst(query, {
          route: "/mgmt/v1/events",
          idPrefix: "evt",
          environment: caller.environment,
        });
        return page.present(audit.list(caller.environment, page), presentAuditEvent);
      },
      {
        scope: "events:read",
        query: PageQuery,
        response: { 200: "event.list" },
        detail: { summary: "Audit events of this key's environment, newest first" },
      },
    );
