import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { DateTime, dataOf, Nullable } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { PLAN_PATH } from "./plan-route.ts";

const Quota = Type.Object({
  limit: Type.Integer(),
  used: Type.Integer(),
  remaining: Type.Integer(),
  limit_with_overage: Type.Integer(),
  resets_at: Nullable(DateTime("null for quotas that do not reset.")),
});

const PlanReport = Type.Object({
  plan: Type.Object({
    code: Type.String(),
    name: Type.String(),
    trial: Type.Boolean(),
    ends_at: Nullable(
      DateTime(
        "When the plan ends; afterwards every other operation answers 402 PLAN_ENDED. null: it does not end.",
      ),
    ),
  }),
  quotas: Type.Record(Type.String(), Quota),
  policy_constraints: Type.Object({
    activation_sync_min_sec: Type.Integer(),
    revocation_exposure_max_sec: Type.Integer(),
    cert_ttl_max_sec: Type.Integer(),
    floating_sync_min_sec: Type.Integer(),
    floating_lease_ttl_min_sec: Type.Integer(),
  }),
  policy_defaults: Type.Object({
    heartbeat_sec: Type.Integer(),
    cert_ttl_sec: Type.Integer(),
    network_grace_sec: Type.Integer(),
  }),
  revocation_exposure_max_sec_by_plan: Type.Record(Type.String(), Type.Integer()),
  license_duration_max_sec: Type.Integer(),
  unavailable_features: Type.Array(
    Type.Object({ key: Type.String(), minimum_plan: Type.String(), minimum_plan_name: Type.String() }),
  ),
});

export const planController = ({ planReport }: Services) =>
  new Elysia({ prefix: PLAN_PATH, detail: { tags: ["Plan and reports"] } })
    .use(managementAuth)
    .model({ "plan.response": dataOf(PlanReport) })
    .get("", () => ({ data: planReport.report() }), {
      scope: "reports:read",
      response: { 200: "plan.response" },
      detail: { summary: "Plan limits and usage (exempt from the management quota and from 402 PLAN_ENDED)" },
    });
