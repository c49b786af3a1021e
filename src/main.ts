import pkg from "../package.json" with { type: "json" };
import { UsageError } from "./cli/args.ts";
import { backupCommands } from "./cli/backup.ts";
import { billingCommands } from "./cli/billing.ts";
import { CliError, out } from "./cli/console.ts";
import { initCommand } from "./cli/init.ts";
import { keysCommands } from "./cli/keys.ts";
import { offlineCommands } from "./cli/offline.ts";
import { planCommands } from "./cli/plan.ts";
import { restoreCommands } from "./cli/restore.ts";
import { sealCommand } from "./cli/seal.ts";
import { sealingKeysCommands } from "./cli/sealing-keys.ts";
import { serveCommand } from "./cli/serve.ts";
import { type Command, helpText, noPositionals, parse } from "./cli/shared.ts";
import { signingKeysCommands } from "./cli/signing-keys.ts";
import type { Env } from "./config.ts";
import { KeystoreError } from "./crypto/keystore.ts";
import { StartupError } from "./startup-checks.ts";

/** A command like the others, so `version extra` and `version --bogus` are usage errors and --help works. */
const versionCommand: Command = {
  name: "version",
  summary: "Print the version of this executable.",
  usage: "licensing version",
  configKeys: [],
  options: [],
  run(line) {
    noPositionals(line);
    out(pkg.version);
    return 0;
  },
};

const COMMANDS: readonly Command[] = [
  initCommand,
  serveCommand,
  ...keysCommands,
  ...planCommands,
  ...signingKeysCommands,
  ...sealingKeysCommands,
  sealCommand,
  ...offlineCommands,
  ...backupCommands,
  ...restoreCommands,
  ...billingCommands,
  versionCommand,
];
const GROUPS: Record<string, string> = {
  keys: "Create, list and revoke management API keys.",
  plan: "Show or change the workspace plan.",
  "signing-keys": "List, rotate and retire a product's signing keys.",
  "sealing-keys": "List, rotate and retire a product's sealed-file sealing keys.",
  offline: "Issue offline packages from the data directory, without a server (air-gapped).",
  billing: "Connect a billing provider (Stripe) and map its prices to licenses.",
};

const TOP_USAGE = `licensing ${pkg.version}: self-hosted software-licensing service

Usage:
${COMMANDS.map((command) => `  ${command.usage}`).join("\n")}

Run "licensing <command> --help" for a command's options and their environment variables.
`;

const groupUsage = (group: string): string =>
  `${GROUPS[group]}\n\nUsage:\n${COMMANDS.filter((c) => c.name.startsWith(`${group} `))
    .map((c) => `  ${c.usage}`)
    .join("\n")}\n`;

const isHelp = (arg: string | undefined) => arg === "-h" || arg === "--help" || arg === "help";

/** Prints help text: 0, or 1 with one line when stdout does not take it. */
function printed(text: string): number {
  try {
    out(text);
    return 0;
  } catch (error) {
    process.stderr.write(`licensing: ${(error as Error).message}\n`);
    return 1;
  }
}

/** Runs one command line and returns the exit code: 0 success, 1 failure, 2 usage error. */
export async function main(argv: readonly string[], env: Env, cwd: string): Promise<number> {
  const [first, second] = argv;
  if (first === undefined) {
    process.stderr.write(TOP_USAGE);
    return 2;
  }
  if (isHelp(first)) return printed(TOP_USAGE);
  if (first === "--version") return run(versionCommand, argv.slice(1), env, cwd);
  let command: Command | undefined;
  let rest: readonly string[];
  if (Object.hasOwn(GROUPS, first)) {
    if (isHelp(second)) return printed(groupUsage(first));
    command = COMMANDS.find((c) => c.name === `${first} ${second}`);
    if (!command) {
      const what = second === undefined ? "a subcommand is needed" : `unknown subcommand "${second}"`;
      process.stderr.write(`licensing ${first}: ${what}\n\n${groupUsage(first)}`);
      return 2;
    }
    rest = argv.slice(2);
  } else {
    command = COMMANDS.find((c) => c.name === first);
    if (!command) {
      process.stderr.write(`licensing: unknown command "${first}"\n\n${TOP_USAGE}`);
      return 2;
    }
    rest = argv.slice(1);
  }
  return run(command, rest, env, cwd);
}

async function run(command: Command, argv: readonly string[], env: Env, cwd: string): Promise<number> {
  const prefix = `licensing ${command.name}:`;
  try {
    const line = parse(command, { argv, env, cwd });
    if (line.help) {
      out(helpText(command));
      return 0;
    }
    return await command.run(line, { argv, env, cwd });
  } catch (error) {
    if (error instanceof UsageError) {
      // The mistake, then where the options are: the whole help (serve's is ~40 lines) would
      // scroll the one line that matters out of sight.
      process.stderr.write(
        `${prefix} ${error.message}\nRun "licensing ${command.name} --help" for its options.\n`,
      );
      return 2;
    }
    if (error instanceof CliError) {
      process.stderr.write(`${prefix} ${error.message}\n`);
      return error.exitCode;
    }
    if (error instanceof StartupError || error instanceof KeystoreError) {
      process.stderr.write(`${prefix} ${error.message}\n`);
      return 1;
    }
    // Operators get one line; the stack only when they ask for debug logs.
    const message = error instanceof Error ? error.message : String(error);
    process.stderr.write(`${prefix} ${message}\n`);
    if (env.LICENSING_LOG_LEVEL === "debug" && error instanceof Error && error.stack) {
      process.stderr.write(`${error.stack}\n`);
    }
    return 1;
  }
}

if (import.meta.main) {
  const code = await main(process.argv.slice(2), process.env, process.cwd());
  process.exit(code);
}
