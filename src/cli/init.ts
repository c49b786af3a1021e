import { randomBytes } from "node:crypto";
import {
  closeSync,
  copyFileSync,
  existsSync,
  fchmodSync,
  fsyncSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  rmSync,
  writeSync,
} from "node:fs";
import { join } from "node:path";
import { type Config, dataPaths } from "../config.ts";
import { Keystore } from "../crypto/keystore.ts";
import { SCOPES } from "../domain/scopes.ts";
import { unwritableDataDir } from "../fs/writable-dir.ts";
import { ApiKeyService } from "../modules/api-keys/service.ts";
import { WorkspaceService } from "../modules/workspace/service.ts";
import { buildDeps } from "../server.ts";
import { filesWrittenInPlace } from "../startup-checks.ts";
import { openStore } from "../store/db.ts";
import { migrate } from "../store/migrate.ts";
import { type ServeLock, takeServeLock } from "../store/serve-lock.ts";
import { UsageError } from "./args.ts";
import { CliError, err, OutputError, out } from "./console.ts";
import { holdSignals, signalExitCode } from "./held-signals.ts";
import { clearInterruptedInit, INIT_STAGING_PREFIX, STAGED } from "./interrupted-init.ts";
import { checkNewPassphrase, type PassphraseSource, resolvePassphrase } from "./secrets.ts";
import {
  type Command,
  isInitialised,
  JSON_OPTION,
  leftoverFolders,
  refuseInterruptedRestore,
} from "./shared.ts";

export interface InitResult {
  dataDir: string;
  apiKeys: { live: string; test: string };
  /** Their ids, for the advice when the keys could not be printed. */
  apiKeyIds: { live: string; test: string };
  /** Null when the passphrase came from LICENSING_KEYSTORE_PASSPHRASE. */
  passphraseFile: string | null;
  passphraseGenerated: boolean;
  /** The migrations applied to the new store. */
  migrations: string[];
  /** What an earlier first start that was cut short had left, and what became of it. */
  recovered: string[];
  /** The `.init-*` folder and the data dir's lock, let go by {@link finishInit}. */
  pending: { staging: string; lock: ServeLock };
}

/** The points between the steps of a first start, in order; tests stop there to see what is left. */
export type InitStep = "staged" | "passphrase placed" | "store placed" | "keystore placed";

/**
 * Creates store, keystore, workspace and two API keys; null when the data dir is initialised
 * already. Everything is built in an `.init-*` folder inside the data dir and then linked into
 * place: a generated passphrase, the store, the keystore last. Nothing replaces a file that
 * appeared meanwhile, so an existing keystore is never overwritten. The folder stays until the
 * caller has printed the API keys and called {@link finishInit}; what a start stopped half-way
 * leaves, the next one clears (interrupted-init.ts). While there is work to do, the data dir's
 * serve lock is held throughout, so a second process starting on the same directory neither
 * initialises it too nor takes this one's folder for a leftover. `afterStep` is for tests.
 */
export function initialiseIfNeeded(
  config: Config,
  afterStep: (step: InitStep) => void = () => {},
): InitResult | null {
  const dataDir = config.dataDir;
  const paths = dataPaths(dataDir);
  try {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  } catch (error) {
    throw new CliError(`cannot create the data directory ${dataDir}: ${(error as Error).message}`);
  }
  const unwritable = unwritableDataDir(dataDir, filesWrittenInPlace(dataDir));
  if (unwritable) throw new CliError(unwritable);
  refuseInterruptedRestore(dataDir);
  // Nothing to do, nothing locked: a second `serve` beside a running one is then refused by the
  // server's own lock, with its own message.
  if (isInitialised(dataDir) && leftoverFolders(dataDir, INIT_STAGING_PREFIX).length === 0) return null;
  const lock = takeServeLock(paths.serveLock);
  if (!lock) {
    throw new CliError(
      `another licensing process is using ${dataDir} (it holds ${paths.serveLock}): a server, or a first ` +
        "start still setting the directory up; wait for it or stop it, then try again",
    );
  }
  let result: InitResult | null = null;
  try {
    const recovered = clearInterruptedInit(dataDir);
    if (isInitialised(dataDir)) {
      for (const note of recovered) err(note);
      return null;
    }
    result = { ...buildAndPlace(config, afterStep, lock), recovered };
    return result;
  } finally {
    if (result === null) lock.release();
  }
}

/** {@link initialiseIfNeeded} for `licensing init`: a data dir initialised already is refused. */
export function initialise(config: Config, afterStep?: (step: InitStep) => void): InitResult {
  const result = initialiseIfNeeded(config, afterStep);
  if (result === null) {
    throw new CliError(
      `${config.dataDir} is already initialised (it has a store or keystore); refusing to overwrite it`,
    );
  }
  return result;
}

/** Once the API keys are printed: the `.init-*` folder goes, and the lock is let go. */
export function finishInit(result: InitResult): void {
  try {
    rmSync(result.pending.staging, { recursive: true, force: true });
  } finally {
    result.pending.lock.release();
  }
}

/**
 * The passphrase given (a file, the variable, or a file the operator put at the default place),
 * or a new one written into the folder, to be linked into place with the other files: a generated
 * passphrase appears in the data dir only with the install it belongs to, and is announced then.
 */
function passphraseFor(config: Config, staging: string): PassphraseSource {
  const defaultFile = dataPaths(config.dataDir).passphrase;
  if (config.passphraseFile || config.passphrase !== null || existsSync(defaultFile)) {
    return resolvePassphrase(config);
  }
  const passphrase = randomBytes(32).toString("base64url");
  const fd = openSync(join(staging, STAGED.passphrase), "wx", 0o600);
  try {
    writeSync(fd, `${passphrase}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  return { passphrase, file: defaultFile, generated: true };
}

function buildAndPlace(
  config: Config,
  afterStep: (step: InitStep) => void,
  lock: ServeLock,
): Omit<InitResult, "recovered"> {
  const dataDir = config.dataDir;
  const paths = dataPaths(dataDir);
  const staging = mkdtempSync(join(dataDir, INIT_STAGING_PREFIX));
  const placed: string[] = [];
  let done = false;
  try {
    const source = passphraseFor(config, staging);
    checkNewPassphrase(source);
    const keystore = Keystore.create(join(staging, STAGED.keystore), source.passphrase);
    const store = openStore(join(staging, STAGED.store));
    let apiKeys: InitResult["apiKeys"];
    let apiKeyIds: InitResult["apiKeyIds"];
    let migrations: string[];
    try {
      migrations = migrate(store.sqlite).applied;
      const deps = buildDeps(store, keystore);
      new WorkspaceService(deps).ensure();
      const service = new ApiKeyService(deps);
      const create = (environment: "live" | "test") =>
        service.create({ environment, scopes: [...SCOPES], name: `${environment} key (created by init)` });
      const [live, test] = [create("live"), create("test")];
      apiKeys = { live: live.apiKey, test: test.apiKey };
      apiKeyIds = { live: live.id, test: test.id };
      // Folds the WAL into the main file so the single .db file is the whole store.
      const checkpoint = store.sqlite.query<{ busy: number }, []>("PRAGMA wal_checkpoint(TRUNCATE)").get();
      if (checkpoint?.busy !== 0) throw new Error("could not checkpoint the new store");
    } finally {
      store.close();
    }
    copyStore(join(staging, STAGED.store), join(staging, STAGED.storeToPlace));
    fsyncDir(staging);
    afterStep("staged");
    const placeFile = (name: string, to: string) => {
      place(join(staging, name), to);
      placed.push(to);
    };
    if (source.generated) {
      placeFile(STAGED.passphrase, paths.passphrase);
      afterStep("passphrase placed");
    }
    placeFile(STAGED.storeToPlace, paths.store);
    afterStep("store placed");
    placeFile(STAGED.keystore, paths.keystore);
    fsyncDir(dataDir);
    afterStep("keystore placed");
    done = true;
    return {
      dataDir,
      apiKeys,
      apiKeyIds,
      passphraseFile: source.file,
      passphraseGenerated: source.generated,
      migrations,
      pending: { staging, lock },
    };
  } finally {
    if (!done) {
      // Only what this run linked into place, newest first: each name was free when it was linked.
      for (const file of placed.reverse()) rmSync(file, { force: true });
      rmSync(staging, { recursive: true, force: true });
    }
  }
}

const refuseExisting = (to: string, error: unknown): never => {
  if ((error as NodeJS.ErrnoException).code === "EEXIST") {
    throw new CliError(`${to} appeared while initialising; refusing to overwrite it`);
  }
  throw error;
};

/** link() fails instead of replacing an existing file, unlike rename(). */
export function place(from: string, to: string): void {
  try {
    linkSync(from, to);
  } catch (error) {
    refuseExisting(to, error);
  }
}

/**
 * The store is copied before it is linked into place: SQLite keeps per-inode state (its
 * shared-memory WAL index) for as long as any statement of the closed staging connection lives,
 * and `serve` opens the store in the same process right after init. Under a link to the file
 * SQLite wrote, that state would still name the staging -shm file, and the server would never see
 * writes made by other processes (the CLI). A copy is a new inode that SQLite has never seen.
 *
 * The file is created empty first, exclusively (an existing one is refused and left alone), so
 * from then on it is ours: a copy that fails half-way (a full disk) removes what it wrote, rather
 * than leaving a truncated store that every later init or restore takes for a real one.
 * `copyFile` is node's, replaced only by tests that make it fail part-way.
 */
export function copyStore(from: string, to: string, copyFile: typeof copyFileSync = copyFileSync): void {
  try {
    closeSync(openSync(to, "wx", 0o600));
  } catch (error) {
    refuseExisting(to, error);
  }
  try {
    copyFile(from, to);
    const fd = openSync(to, "r+");
    try {
      fchmodSync(fd, 0o600);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  } catch (error) {
    rmSync(to, { force: true });
    throw error;
  }
}

export function fsyncDir(path: string): void {
  const fd = openSync(path, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** What an operator must read once: the keys are never shown again. */
export function describeInit(result: InitResult): string {
  const lines = [
    `Initialised ${result.dataDir}`,
    "",
    "API keys (shown only now; store them somewhere safe):",
    `  live: ${result.apiKeys.live}`,
    `  test: ${result.apiKeys.test}`,
    "",
  ];
  if (result.passphraseGenerated) {
    lines.push(
      `A random keystore passphrase was written to ${result.passphraseFile} (mode 0600).`,
      "For production, move it off the data volume and point LICENSING_KEYSTORE_PASSPHRASE_FILE",
      "(or --passphrase-file) at its new place: whoever holds the data dir and this file holds every key.",
      "",
    );
  }
  return lines.join("\n");
}

/**
 * The failure when the new API keys could not be printed: the data dir is set up, and its two
 * keys are live, but nobody saw them (only their hashes are stored).
 */
export function unprintedKeys(result: InitResult, error: OutputError): CliError {
  const { live, test } = result.apiKeyIds;
  return new CliError(
    `initialised ${result.dataDir}, but its API keys could not be printed (${error.reason}); nobody has seen them: ` +
      `create new ones with "licensing keys create --data-dir ${result.dataDir}", then revoke ${live} and ${test} ` +
      'with "licensing keys revoke"',
  );
}

export const initCommand: Command = {
  name: "init",
  summary:
    "Create a new data directory: store, sealed keystore, workspace, and one live and one test API key.",
  usage: "licensing init [--data-dir DIR] [--passphrase-file FILE] [--json]",
  configKeys: ["dataDir", "passphraseFile"],
  options: [JSON_OPTION],
  async run(line) {
    if (line.positionals.length > 0) throw new UsageError(`unexpected argument ${line.positionals[0]}`);
    // Ctrl-C (or SIGTERM) takes effect once the keys are printed, never between creating and showing them.
    const signals = holdSignals();
    try {
      const result = initialise(line.config);
      try {
        for (const note of result.recovered) err(note);
        printInit(result, line.flags.json === true);
      } catch (error) {
        if (error instanceof OutputError) throw unprintedKeys(result, error);
        throw error;
      } finally {
        finishInit(result);
      }
      await signals.settle();
      const signal = signals.received();
      return signal ? signalExitCode(signal) : 0;
    } finally {
      signals.release();
    }
  },
};

function printInit(result: InitResult, json: boolean): void {
  if (!json) {
    out(describeInit(result));
    return;
  }
  out(
    JSON.stringify({
      data_dir: result.dataDir,
      api_keys: result.apiKeys,
      passphrase_file: result.passphraseFile,
    }),
  );
  if (result.passphraseGenerated) {
    process.stderr.write(
      `A random keystore passphrase was written to ${result.passphraseFile}; move it elsewhere for production.\n`,
    );
  }
}
