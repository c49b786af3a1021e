import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { requestState } from "../../http/request-state.ts";
import { DateTime, dataOf } from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { checkReportQuery, MAX_PERIOD_LENGTH } from "./service.ts";

const REPORT_SCOPE = "reports:read";

const UsageReport = Type.Object({
  period: Type.Object({ label: Type.String(), start: DateTime(), end: DateTime() }),
  new_activations: Type.Integer(),
  active_machines: Type.Integer(),
  active_licenses: Type.Integer(),
  active_leases: Type.Integer(),
});

export const reportsController = ({ usageReport }: Services) =>
  new Elysia({ prefix: "/mgmt/v1/reports", detail: { tags: ["Plan and reports"] } })
    .use(managementAuth)
    .model({ "usage-report.response": dataOf(UsageReport) })
    .get(
      "/usage",
      async ({ caller, query }) => ({ data: await usageReport.report(caller.environment, query.period) }),
      {
        scope: REPORT_SCOPE,
        // Before the schema: every bad query of this route is 400 (spec), none 422. This hook runs
        // before the scope's own (managementAuth), which answers a caller without it 403 first.
        transform: ({ request, query }) => {
          if (requestState.get(request)?.caller?.scopes.has(REPORT_SCOPE)) checkReportQuery(query);
        },
        query: Type.Object({
          period: Type.Optional(
            Type.String({
              maxLength: MAX_PERIOD_LENGTH,
              description: "current_month (default), previous_month, or YYYY-MM (UTC).",
            }),
          ),
        }),
        response: { 200: "usage-report.response" },
        detail: { summary: "Usage report of this key's environment" },
      },
    );
