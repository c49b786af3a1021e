import { type CommandLine, UsageError } from "../config.ts";
import { systemClock } from "../domain/clock.ts";
import { IdGenerator } from "../domain/ids.ts";
import { PLANS, type PlanDefinition, planByCode } from "../domain/plans.ts";
import { WorkspaceService } from "../modules/workspace/service.ts";
import { table } from "./keys.ts";
import { CliError, type Command, cliActor, JSON_OPTION, openExistingStore, out } from "./shared.ts";

/** The plan lives in the workspace row only, so these commands need the store but not the keystore. */
function withWorkspace<T>(line: CommandLine, work: (workspace: WorkspaceService) => T): T {
  const { store } = openExistingStore(line.config.dataDir);
  try {
    const workspace = new WorkspaceService({ db: store.db, clock: systemClock, ids: new IdGenerator() });
    if (!workspace.exists()) {
      throw new CliError(`the store in ${line.config.dataDir} has no workspace; was init interrupted?`);
    }
    return work(workspace);
  } finally {
    store.close();
  }
}

function describePlan(plan: PlanDefinition): string {
  const quotas = Object.entries(plan.quotas).map(([name, quota]) => [
    name,
    String(quota.limit),
    String(quota.overage),
    quota.period,
  ]);
  const constraints = Object.entries(plan.policy_constraints).map(([name, value]) => `  ${name}: ${value}`);
  return [
    `Plan: ${plan.code} (${plan.name})`,
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
    const plan = withWorkspace(line, (workspace) => workspace.plan());
    out(line.flags.json === true ? JSON.stringify(plan) : describePlan(plan));
    return 0;
  },
};

export const planSetCommand: Command = {
  name: "plan set",
  summary: `Change the workspace plan; a running server picks it up on its next request. Codes: ${codes()}.`,
  usage: "licensing plan set CODE [--data-dir DIR]",
  configKeys: ["dataDir"],
  options: [],
  run(line) {
    const [code, extra] = line.positionals;
    if (code === undefined) throw new UsageError(`give a plan code: ${codes()}`);
    if (extra !== undefined) throw new UsageError(`unexpected argument ${extra}`);
    if (!planByCode(code)) throw new UsageError(`unknown plan "${code}"; choose one of ${codes()}`);
    const plan = withWorkspace(line, (workspace) => workspace.setPlan(code, cliActor()));
    out(`The workspace plan is now ${plan.code} (${plan.name}).`);
    return 0;
  },
};

export const planCommands = [planShowCommand, planSetCommand];
