import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { userInfo } from "node:os";
import {
  CONFIG_OPTIONS,
  type CommandLine,
  type ConfigKey,
  dataPaths,
  type Env,
  parseCommandLine,
} from "../config.ts";
import { openStore, type Store, unusableStoreFile } from "../store/db.ts";
import { migrate } from "../store/migrate.ts";
import type { Actor } from "../store/schema/index.ts";
import { formatOptions, type OptionSpec } from "./args.ts";

/** A failure the operator can act on: printed as one line, no stack trace. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode = 1,
  ) {
    super(message);
    this.name = "CliError";
  }
}

export interface CommandContext {
  argv: readonly string[];
  env: Env;
  cwd: string;
}

export interface Command {
  name: string;
  summary: string;
  /** The synopsis line(s) shown by --help and on usage errors. */
  usage: string;
  configKeys: readonly ConfigKey[];
  options: readonly OptionSpec[];
  run(line: CommandLine, context: CommandContext): Promise<number> | number;
}

export const JSON_OPTION: OptionSpec = {
  name: "json",
  kind: "boolean",
  description: "print machine-readable JSON on stdout",
};

export const parse = (command: Command, context: CommandContext): CommandLine =>
  parseCommandLine(context.argv, context.env, context.cwd, command.configKeys, command.options);

export const out = (text: string): void => {
  process.stdout.write(text.endsWith("\n") ? text : `${text}\n`);
};
export const err = (text: string): void => {
  process.stderr.write(text.endsWith("\n") ? text : `${text}\n`);
};

/** A data dir counts as initialised as soon as either half exists; neither is ever overwritten. */
export function isInitialised(dataDir: string): boolean {
  const paths = dataPaths(dataDir);
  return existsSync(paths.keystore) || existsSync(paths.store);
}

export interface PassphraseSource {
  passphrase: string;
  /** The file it came from; null when it came from LICENSING_KEYSTORE_PASSPHRASE. */
  file: string | null;
  generated: boolean;
}

const MIN_NEW_PASSPHRASE = 12;

/**
 * --passphrase-file, LICENSING_KEYSTORE_PASSPHRASE_FILE, LICENSING_KEYSTORE_PASSPHRASE, then
 * <data>/keystore.passphrase. With `generate`, a missing default file is created (init only).
 */
export function resolvePassphrase(
  config: CommandLine["config"],
  options: { generate: boolean },
): PassphraseSource {
  if (config.passphraseFile) {
    return {
      passphrase: readPassphraseFile(config.passphraseFile),
      file: config.passphraseFile,
      generated: false,
    };
  }
  if (config.passphrase !== null) return { passphrase: config.passphrase, file: null, generated: false };
  const file = dataPaths(config.dataDir).passphrase;
  if (existsSync(file)) return { passphrase: readPassphraseFile(file), file, generated: false };
  if (!options.generate) {
    throw new CliError(
      `no keystore passphrase: ${file} does not exist; give --passphrase-file, ` +
        "LICENSING_KEYSTORE_PASSPHRASE_FILE or LICENSING_KEYSTORE_PASSPHRASE",
    );
  }
  const passphrase = randomBytes(32).toString("base64url");
  try {
    // "wx": never replace a passphrase file that appeared meanwhile.
    writeFileSync(file, `${passphrase}\n`, { mode: 0o600, flag: "wx" });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") {
      return { passphrase: readPassphraseFile(file), file, generated: false };
    }
    throw error;
  }
  return { passphrase, file, generated: true };
}

export function checkNewPassphrase(source: PassphraseSource): void {
  if (!source.generated && source.passphrase.length < MIN_NEW_PASSPHRASE) {
    throw new CliError(`the keystore passphrase must be at least ${MIN_NEW_PASSPHRASE} characters long`);
  }
}

function readPassphraseFile(path: string): string {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new CliError(`cannot read the passphrase file ${path}: ${(error as Error).message}`);
  }
  // `echo secret > file` adds a newline that is not part of the passphrase.
  const passphrase = text.replace(/[\r\n]+$/, "");
  if (passphrase === "") throw new CliError(`the passphrase file ${path} is empty`);
  if ((statSync(path).mode & 0o077) !== 0) {
    err(`warning: ${path} is readable by other users; chmod 600 it`);
  }
  return passphrase;
}

/** Opens an existing store and brings its schema up to date (forward-only, a no-op when current). */
export function openExistingStore(dataDir: string): { store: Store; applied: string[] } {
  const path = dataPaths(dataDir).store;
  if (!existsSync(path)) {
    throw new CliError(`no store at ${path}; run "licensing init --data-dir ${dataDir}" first`);
  }
  const unusable = unusableStoreFile(path);
  if (unusable) throw new CliError(`the store ${path} ${unusable}; restore the store from a backup`);
  const store = openStore(path);
  try {
    return { store, applied: migrate(store.sqlite).applied };
  } catch (error) {
    store.close();
    throw new CliError(`cannot use the store ${path}: ${(error as Error).message}`);
  }
}

/** Text for `--help` and usage errors. */
export function helpText(command: Command): string {
  const options = [
    ...command.configKeys.map((key) => CONFIG_OPTIONS[key]),
    ...command.options,
    { name: "help", kind: "boolean", description: "show this help" } satisfies OptionSpec,
  ];
  return `${command.summary}\n\nUsage:\n  ${command.usage}\n\nOptions:\n${formatOptions(options)}\n`;
}

/** Who acted, for the audit trail of command-line changes: the operating-system user. */
export function cliActor(): Actor {
  let user = "unknown";
  try {
    user = userInfo().username;
  } catch {
    // No passwd entry (some containers): the audit still records that the command line acted.
  }
  return { type: "cli", id: user };
}
