import type { CommandLine } from "../config.ts";
import { systemClock } from "../domain/clock.ts";
import { parseDateTime } from "../domain/datetime.ts";
import { IdGenerator } from "../domain/ids.ts";
import { PLANS, planByCode } from "../domain/plans.ts";
import { type PlanTerms, WorkspaceService } from "../modules/workspace/service.ts";
import { UsageError } from "./args.ts";
import { CliError, out } from "./console.ts";
import { table } from "./keys.ts";
import { type Command, cliActor, JSON_OPTION, openExistingStore } from "./shared.ts";

/** The plan lives in the workspace row only, so these commands need the store but not the keystore. */
function withWorkspace<T>(line: CommandLine, work: (workspace: WorkspaceService) => T): T {
  const { store } = openExistingStore(line.config.dataDir);
  try {
    const workspace = new WorkspaceService({
      db: store.db,
      sqlite: store.sqlite,
      clock: systemClock,
      ids: new IdGenerator(),
    });
    if (!workspace.exists()) {
      throw new CliError(`the store in ${line.config.dataDir} has no workspace; was init interrupted?`);
    }
    return work(workspace);
  } finally {
    store.close();
  }
}

function describePlan({ plan, trial, endsAt }: PlanTerms): string {
  const quotas = Object.entries(plan.quotas).map(([name, quota]) => [
    name,
    String(quota.limit),
    String(quota.overage),
    quota.period,
  ]);
  const constraints = Object.entries(plan.policy_constraints).map(([name, value]) => `  ${name}: ${value}`);
  return [
    `Plan: ${plan.code} (${plan.name})${trial ? ", trial" : ""}`,
    `Ends: ${endsAt ? endsAt.toISOString() : "never"}`,
    `Features: ${plan.features.join(", ") || "none"}`,
    `License duration max: ${plan.license_duration_max_sec} s`,
    "",
    table(["QUOTA", "LIMIT", "OVERAGE", "PERIOD"], quotas),
    "",
    "Policy constraints:",
    ...constraints,
  ].join("\n");
}

const codes = () => Object.keys(PLANS).join(", ");

export const planShowCommand: Command = {
  name: "plan show",
  summary: "Show the workspace plan: features, quotas and policy constraints.",
  usage: "licensing plan show [--json] [--data-dir DIR]",
  configKeys: ["dataDir"],
  options: [JSON_OPTION],
  run(line) {
    if (line.positionals.length > 0) throw new UsageError(`unexpected argument ${line.positionals[0]}`);
    const terms = withWorkspace(line, (workspace) => workspace.terms());
    out(
      line.flags.json === true
        ? JSON.stringify({ ...terms.plan, trial: terms.trial || terms.plan.trial, ends_at: terms.endsAt })
        : describePlan(terms),
    );
    return 0;
  },
};

export const planSetCommand: Command = {
  name: "plan set",
  summary:
    "Change the workspace plan and its term; a running server picks it up within a second. " +
    `After --ends-at every API call but GET /mgmt/v1/plan answers 402 PLAN_ENDED. Codes: ${codes()}.`,
  usage: "licensing plan set CODE [--ends-at ISO [--allow-past]] [--trial] [--data-dir DIR]",
  configKeys: ["dataDir"],
  options: [
    {
      name: "ends-at",
      kind: "string",
      valueName: "ISO",
      description: "when the plan ends (RFC 3339, e.g. 2027-01-01T00:00:00Z); default: it does not end",
    },
    { name: "trial", kind: "boolean", description: "the plan is a trial (needs --ends-at)" },
    {
      name: "allow-past",
      kind: "boolean",
      description: "accept an --ends-at that has passed, which ends the plan at once",
    },
  ],
  run(line) {
    const [code, extra] = line.positionals;
    if (code === undefined) throw new UsageError(`give a plan code: ${codes()}`);
    if (extra !== undefined) throw new UsageError(`unexpected argument ${extra}`);
    if (!planByCode(code)) throw new UsageError(`unknown plan "${code}"; choose one of ${codes()}`);
    const endsAtText = line.flags["ends-at"];
    const endsAt = typeof endsAtText === "string" ? parseDateTime(endsAtText) : null;
    if (typeof endsAtText === "string" && endsAt === null) {
      throw new UsageError(`--ends-at must be an RFC 3339 date-time with a zone, not "${endsAtText}"`);
    }
    // A date already past (a typo in the year, a date meant as a start) ends the plan the moment it
    // is set: every call then answers 402. Done on purpose only.
    if (
      endsAt !== null &&
      endsAt.getTime() <= systemClock.now().getTime() &&
      line.flags["allow-past"] !== true
    ) {
      throw new UsageError(
        `--ends-at ${endsAt.toISOString()} has passed: the plan would end at once, and every API call but ` +
          "GET /mgmt/v1/plan would answer 402 PLAN_ENDED; add --allow-past to end it now on purpose",
      );
    }
    if (line.flags["allow-past"] === true && endsAt === null) {
      throw new UsageError("--allow-past goes with --ends-at");
    }
    const trial = line.flags.trial === true;
    if (trial && endsAt === null) throw new UsageError("--trial needs --ends-at: a trial ends");
    const plan = withWorkspace(line, (workspace) => workspace.setPlan(code, cliActor(), { endsAt, trial }));
    const ended = endsAt !== null && endsAt.getTime() <= systemClock.now().getTime();
    const term = endsAt
      ? `, ${trial ? "trial " : ""}${ended ? "ended" : "ending"} ${endsAt.toISOString()}`
      : "";
    out(`The workspace plan is now ${plan.code} (${plan.name})${term}.`);
    return 0;
  },
};

export const planCommands = [planShowCommand, planSetCommand];
