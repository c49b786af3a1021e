import { existsSync, lstatSync, readdirSync, readFileSync, realpathSync } from "node:fs";
import { basename, dirname, join, sep } from "node:path";
import type { Config } from "../config.ts";
import {
  CONFIG_OPTIONS,
  type CommandLine,
  type ConfigKey,
  dataPaths,
  type Env,
  parseCommandLine,
} from "../config.ts";
import type { Deps } from "../deps.ts";
import { WorkspaceService } from "../modules/workspace/service.ts";
import { buildDeps, openKeystore } from "../server.ts";
import { type Store, unusableStoreFile } from "../store/db.ts";
import { openMigratedStore, StoreOpenElsewhere } from "../store/migrate-alone.ts";
import type { Actor } from "../store/schema/index.ts";
import { type ServeLock, takeServeLock } from "../store/serve-lock.ts";
import { formatOptions, type OptionSpec, UsageError } from "./args.ts";
import { CliError } from "./console.ts";
import { resolvePassphrase } from "./secrets.ts";

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

/** A data dir counts as initialised as soon as either half exists; neither is ever overwritten. */
export function isInitialised(dataDir: string): boolean {
  const paths = dataPaths(dataDir);
  return existsSync(paths.keystore) || existsSync(paths.store);
}

/**
 * Refuses a data directory where nothing was initialised, before a command that works on an
 * existing install resolves a passphrase or opens a file: the usual cause is a command run
 * without --data-dir from a directory that is not the server's (the default is ./data), and what
 * fails next (no passphrase file, no keystore, "run licensing init") would send the operator to
 * make a new, empty install instead of pointing at the one they have.
 */
export function requireInitialised(dataDir: string): void {
  if (isInitialised(dataDir)) return;
  // What a restore that died leaves has its own advice (run it again).
  refuseInterruptedRestore(dataDir);
  const what = existsSync(dataDir) ? "it holds neither a store nor a keystore" : "nothing initialised there";
  throw new CliError(
    `no data directory at ${dataDir} (${what}): pass --data-dir or LICENSING_DATA_DIR with the server's data directory, ` +
      'or run "licensing init" to make a new one',
  );
}

/**
 * Where `restore` builds and checks the data dir before putting its files in place. The folder is
 * made inside the data dir on purpose: a restore that dies half-way (SIGTERM, kill -9, a reboot)
 * leaves the directory non-empty, so nothing can mistake it for a fresh volume to initialise.
 */
export const RESTORE_STAGING_PREFIX = ".restore-";

/** The `.restore-*` folders in a data dir, sorted: each was left by a restore that did not finish. */
export const leftoverRestores = (dataDir: string): string[] =>
  leftoverFolders(dataDir, RESTORE_STAGING_PREFIX);

/** The names of the folders in a data dir whose names start with `prefix` (a staging folder's), sorted. */
export function leftoverFolders(dataDir: string, prefix: string): string[] {
  let names: string[];
  try {
    names = readdirSync(dataDir);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") return [];
    throw error;
  }
  // lstat: a symbolic link with that name is not a folder a command made, and is never removed.
  return names
    .filter((name) => name.startsWith(prefix) && lstatSync(join(dataDir, name)).isDirectory())
    .sort();
}

/**
 * `serve` and `init` stop at a data dir that a restore was writing when it died: without a store
 * and keystore in place it would look uninitialised, and a blank install with new API keys would
 * start where the operator expects the backup.
 */
export function refuseInterruptedRestore(dataDir: string): void {
  const [leftover] = leftoverRestores(dataDir);
  if (leftover === undefined) return;
  throw new CliError(
    `a restore into ${dataDir} did not finish (it left ${join(dataDir, leftover)}); ` +
      "run the restore again, which removes that folder first, or delete the folder to use the directory without the backup",
  );
}

/** `--product ID`, as the key commands (signing-keys, sealing-keys) take it. */
export const PRODUCT_OPTION = {
  name: "product",
  kind: "string",
  valueName: "ID",
  description: "the product (prod_…)",
} as const;

/** The settings a command that opens the keystore reads. */
export const KEYSTORE_CONFIG_KEYS = ["dataDir", "passphraseFile"] as const;

export function productFlag(line: CommandLine): string {
  const product = line.flags.product;
  if (typeof product !== "string" || product === "") throw new UsageError("--product is required");
  return product;
}

export function noPositionals(line: CommandLine, expected = 0): void {
  if (line.positionals.length > expected)
    throw new UsageError(`unexpected argument ${line.positionals[expected]}`);
}

/**
 * Runs `work` with the store and the unlocked keystore of the data directory, for commands that
 * change keys (they need the passphrase); the store is closed afterwards. A running server on the
 * same directory picks the change up.
 */
export function withKeystoreDeps<T>(line: CommandLine, work: (deps: Deps) => T): T {
  requireInitialised(line.config.dataDir);
  const { passphrase } = resolvePassphrase(line.config);
  const keystore = openKeystore(line.config.dataDir, passphrase);
  const { store } = openExistingStore(line.config.dataDir);
  try {
    return work(buildDeps(store, keystore));
  } finally {
    store.close();
  }
}

/**
 * The service's base URL for what a command prints or signs: the one given (--base-url,
 * LICENSING_BASE_URL), else the one the last `licensing serve` on this store ran with, else the
 * default from host and port.
 */
export function serviceBaseUrl(config: Config, deps: Deps): string {
  if (config.baseUrlGiven) return config.baseUrl;
  return new WorkspaceService(deps).recordedBaseUrl() ?? config.baseUrl;
}

export const OLDER_SERVER_RUNNING =
  "the running server is older than this executable (the store needs migrations it has not run): " +
  "upgrade the server and restart it first, or stop it";
/** What another process having the store open means where no serve.lock names a server. */
export const STORE_OPEN_ELSEWHERE =
  "another process has the store open, a running server older than this executable or another command " +
  "(the store needs migrations it has not run): upgrade the server and restart it first, or stop it, " +
  "or let the command finish";

/**
 * Opens an existing store and brings its schema up to date (forward-only, a no-op when current).
 * With nothing to migrate, a command works beside a running server, as it always has. Otherwise
 * the migrations run only while no other process has the store open, and keep every other out
 * until they are done: a server running on a store that still needs migrations is older than this
 * executable, and migrating under it would leave the rows it writes afterwards without what the
 * new columns mean, and stop it from starting again. A server since serve.lock is named by its
 * lock (held here too, so none starts meanwhile); an older one, or another command, by its
 * connection to the store (openMigratedStore).
 */
export function openExistingStore(dataDir: string): { store: Store; applied: string[] } {
  requireInitialised(dataDir);
  const paths = dataPaths(dataDir);
  const path = paths.store;
  if (!existsSync(path)) {
    throw new CliError(`no store at ${path}; run "licensing init --data-dir ${dataDir}" first`);
  }
  const unusable = unusableStoreFile(path);
  if (unusable) throw new CliError(`the store ${path} ${unusable}; restore the store from a backup`);
  try {
    const { store, result } = openMigratedStore(path, (migrateNow) => {
      const lock = lockOutServer(paths.serveLock);
      try {
        return migrateNow();
      } finally {
        lock?.release();
      }
    });
    return { store, applied: result.applied };
  } catch (error) {
    if (error instanceof CliError) throw error;
    if (error instanceof StoreOpenElsewhere) throw new CliError(STORE_OPEN_ELSEWHERE);
    throw new CliError(`cannot use the store ${path}: ${(error as Error).message}`);
  }
}

/**
 * The server's lock, or {@link OLDER_SERVER_RUNNING} when a server holds it. Null when there is no
 * lock file (the command does not make one: it would be the command's user's file, which a server
 * running as another user could not lock), or a file SQLite cannot lock, which no server holds.
 */
function lockOutServer(lockPath: string): ServeLock | null {
  if (!existsSync(lockPath)) return null;
  let lock: ServeLock | null;
  try {
    lock = takeServeLock(lockPath);
  } catch {
    return null;
  }
  if (!lock) throw new CliError(OLDER_SERVER_RUNNING);
  return lock;
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

/** Where cliActor looks; injectable so tests do not depend on the machine's user. */
export interface ActorSources {
  env: Env;
  /** The process's uid; null where there is none (Windows). */
  uid: number | null;
  /** The text of /etc/passwd, or null when it cannot be read. */
  passwd: () => string | null;
}

const PROCESS_ACTOR_SOURCES: ActorSources = {
  env: process.env,
  uid: typeof process.getuid === "function" ? process.getuid() : null,
  passwd: () => {
    try {
      return readFileSync("/etc/passwd", "utf8");
    } catch {
      return null;
    }
  },
};

/**
 * Who acted, for the audit trail of command-line changes: the operating-system user. Bun's
 * os.userInfo() takes the name from $USER and says "unknown" without it (containers, cron,
 * systemd units), although the uid has a passwd entry; so the name comes from $USER, else the
 * uid's passwd entry, else `uid:<n>`, which still tells operators apart. $USER is whatever the
 * caller set (`USER=ceo-alice licensing …`), so the uid is recorded beside it: the name is a
 * claim, the uid is who ran the command.
 */
export function cliActor(sources: ActorSources = PROCESS_ACTOR_SOURCES): Extract<Actor, { type: "cli" }> {
  const actor = (id: string): Extract<Actor, { type: "cli" }> =>
    sources.uid === null ? { type: "cli", id } : { type: "cli", id, uid: sources.uid };
  const named = sources.env.USER || sources.env.LOGNAME || sources.env.USERNAME;
  if (named) return actor(named);
  if (sources.uid === null) return actor("unknown");
  const uid = String(sources.uid);
  for (const line of (sources.passwd() ?? "").split("\n")) {
    // name:password:uid:gid:gecos:home:shell
    const [name, , entryUid] = line.split(":");
    if (name && entryUid === uid && !name.startsWith("#")) return actor(name);
  }
  return actor(`uid:${uid}`);
}

/**
 * Refuses an output file given with a trailing separator (`seal IN newdir/`): path.resolve drops
 * it, and a file named like the directory the operator meant would be written instead.
 */
export function refuseDirectoryForm(given: string): void {
  if (given.endsWith("/") || given.endsWith(sep))
    throw new CliError(
      `cannot write ${given}: a file is needed, and a name ending in "${sep}" is a directory's`,
    );
}

/** Where a path that may not exist yet leads: its nearest existing ancestor's links followed. */
export function located(path: string): string {
  const rest: string[] = [];
  let at = path;
  for (;;) {
    try {
      return join(realpathSync(at), ...rest);
    } catch {
      const parent = dirname(at);
      if (parent === at) return path;
      rest.unshift(basename(at));
      at = parent;
    }
  }
}

/**
 * Whether a command's output directory `dir` (which may not exist yet) is the data directory or
 * inside it, links followed for both: the data directory holds only the service's own files, and
 * some names there break the install. False when there is no data directory.
 */
export function withinDataDir(dir: string, dataDir: string): boolean {
  let dataReal: string;
  try {
    dataReal = realpathSync(dataDir);
  } catch {
    return false;
  }
  const where = [located(dir)];
  try {
    where.push(realpathSync(dir));
  } catch {
    // Not there yet (the usual case): where its entry will be is what counts.
  }
  return where.some((path) => path === dataReal || path.startsWith(join(dataReal, sep)));
}
