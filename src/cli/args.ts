/**
 * The command line's grammar, shared by every command: flags and their values, positionals, help,
 * and the usage error that exits with code 2. What the flags mean is config.ts's (the server's
 * settings) and each command's own.
 */

/** A mistake in how the program was invoked (flag, value, environment variable): exit code 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

export interface OptionSpec {
  /** Long flag name without the dashes, e.g. "data-dir". */
  name: string;
  kind: "string" | "boolean";
  /** Placeholder shown in help for string options, e.g. "DIR". */
  valueName?: string;
  env?: string;
  description: string;
}

export type FlagValues = Record<string, string | boolean>;

export interface ParsedArgs {
  flags: FlagValues;
  positionals: string[];
  help: boolean;
}

const BOOLEAN_WORDS: Record<string, boolean> = {
  "1": true,
  true: true,
  yes: true,
  on: true,
  "0": false,
  false: false,
  no: false,
  off: false,
};

/**
 * The one flag parser every command uses: `--name value`, `--name=value`, boolean `--name` (or
 * `--name=true|false`), `-h`/`--help`, and `--` to end the flags. Anything else starting with a
 * dash is an error rather than a positional, so a typo never silently becomes an argument.
 */
export function parseArgs(argv: readonly string[], options: readonly OptionSpec[]): ParsedArgs {
  const byName = new Map(options.map((option) => [option.name, option]));
  const flags: FlagValues = {};
  const positionals: string[] = [];
  let help = false;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (arg === "--") {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (arg === "-h" || arg === "--help") {
      help = true;
      continue;
    }
    if (!arg.startsWith("-") || arg === "-") {
      positionals.push(arg);
      continue;
    }
    if (!arg.startsWith("--")) throw new UsageError(`unknown option ${arg}`);
    const eq = arg.indexOf("=");
    const name = arg.slice(2, eq === -1 ? undefined : eq);
    const inline = eq === -1 ? undefined : arg.slice(eq + 1);
    const option = byName.get(name);
    if (!option) throw new UsageError(`unknown option --${name}`);
    if (Object.hasOwn(flags, name)) throw new UsageError(`--${name} is given more than once`);
    if (option.kind === "boolean") {
      if (inline === undefined) flags[name] = true;
      else flags[name] = parseBoolean(inline, `--${name}`);
      continue;
    }
    let value = inline;
    if (value === undefined) {
      const next = argv[i + 1];
      if (next === undefined || next.startsWith("--")) {
        throw new UsageError(`--${name} needs a value (${option.valueName ?? "VALUE"})`);
      }
      value = next;
      i++;
    }
    if (value === "") throw new UsageError(`--${name} needs a non-empty value`);
    flags[name] = value;
  }
  return { flags, positionals, help };
}

export function parseBoolean(value: string, source: string): boolean {
  const parsed = BOOLEAN_WORDS[value.trim().toLowerCase()];
  if (parsed === undefined) throw new UsageError(`${source} must be true or false, not "${value}"`);
  return parsed;
}

/** Help text for a set of options: flag, env twin, description. */
export function formatOptions(options: readonly OptionSpec[]): string {
  const rows = options.map((option) => {
    const short = option.name === "help" ? "-h, " : "";
    const flag = `${short}--${option.name}${option.kind === "string" ? ` ${option.valueName ?? "VALUE"}` : ""}`;
    const env = option.env ? ` [env ${option.env}]` : "";
    return { flag, text: `${option.description}${env}` };
  });
  const width = Math.max(0, ...rows.map((row) => row.flag.length)) + 2;
  return rows.map((row) => `  ${row.flag.padEnd(width)}${row.text}`).join("\n");
}
