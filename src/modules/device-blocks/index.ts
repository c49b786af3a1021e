import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { FieldErrorCollector } from "../../http/errors.ts";
import { PageQuery } from "../../http/pagination.ts";
import { parseIfMatch } from "../../http/preconditions.ts";
import { json, noContent } from "../../http/respond.ts";
import { DateTime, dataOf, IdField, listOf, NoEtagIfMatchHeaders, Nullable } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";
import type { Services } from "../../services.ts";
import { presentDeviceBlock } from "./service.ts";

const DeviceBlockCreate = Type.Object(
  {
    kind: StringEnum(["device_key", "license"] as const),
    device_signing_key_thumbprint: Type.Optional(Type.String({ pattern: "^[0-9a-f]{64}$" })),
    license_id: Type.Optional(IdField()),
    reason: Type.Optional(Type.String({ maxLength: 500 })),
  },
  { additionalProperties: false },
);

const DeviceBlock = Type.Object({
  id: Type.String(),
  kind: StringEnum(["device_key", "license"] as const),
  device_signing_key_thumbprint: Nullable(Type.String()),
  license_id: Nullable(Type.String()),
  reason: Nullable(Type.String()),
  created_at: DateTime(),
});

/** The device-risk policy: block a device key (by thumbprint) or a license from the runtime API. */
export const deviceBlocksController = ({ deviceBlocks, licenses, pages }: Services) =>
  new Elysia({ prefix: "/mgmt/v1/device-blocks", detail: { tags: ["Activations"] } })
    .use(managementAuth)
    .model({
      "device-block.create": DeviceBlockCreate,
      "device-block.response": dataOf(DeviceBlock),
      "device-block.list": listOf(DeviceBlock),
    })
    .get(
      "",
      ({ caller, query }) => {
        const page = pages.newestFirst(query, {
          route: "/mgmt/v1/device-blocks",
          idPrefix: "blk",
          environment: caller.environment,
        });
        return page.present(deviceBlocks.list(caller.environment, page), presentDeviceBlock);
      },
      {
        scope: "licenses:read",
        query: PageQuery,
        response: { 200: "device-block.list" },
        detail: { summary: "List blocks" },
      },
    )
    .post(
      "",
      ({ caller, body, request }) => {
        // Each kind takes its own target field; the other one is refused, never silently dropped.
        const field = body.kind === "device_key" ? "device_signing_key_thumbprint" : "license_id";
        const otherField = body.kind === "device_key" ? "license_id" : "device_signing_key_thumbprint";
        const target = body[field];
        const errors = new FieldErrorCollector();
        if (!target) errors.add(field, `is required when kind is ${body.kind}`);
        if (body[otherField] !== undefined)
          errors.add(otherField, `does not apply when kind is ${body.kind}`);
        if (target && body.kind === "license" && !licenses.exists(target, caller.environment))
          errors.add("license_id", "does not exist for this key");
        errors.throwIfAny();
        if (!target) throw new Error("unreachable: a missing target is a field error");
        const row = deviceBlocks.create(
          { kind: body.kind, target, reason: body.reason ?? null },
          changeContext(caller, request),
        );
        return json(201, { data: presentDeviceBlock(row) });
      },
      {
        scope: "licenses:write",
        body: "device-block.create",
        response: { 201: "device-block.response" },
        detail: {
          summary: "Block a device key or a license (403 DEVICE_BLOCKED / LICENSE_BLOCKED at runtime)",
        },
      },
    )
    .delete(
      "/:id",
      ({ caller, params, headers, request }) => {
        deviceBlocks.remove(params.id, parseIfMatch(headers["if-match"]), changeContext(caller, request));
        return noContent();
      },
      {
        scope: "licenses:write",
        headers: NoEtagIfMatchHeaders,
        detail: { summary: "Lift a block (repeating is harmless)" },
      },
    );
