import {
  closeSync,
  copyFileSync,
  fchmodSync,
  fsyncSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  rmSync,
} from "node:fs";
import { join } from "node:path";
import { type Config, dataPaths } from "../config.ts";
import { Keystore } from "../crypto/keystore.ts";
import { SCOPES } from "../domain/scopes.ts";
import { ApiKeyService } from "../modules/api-keys/service.ts";
import { WorkspaceService } from "../modules/workspace/service.ts";
import { buildDeps } from "../server.ts";
import { openStore } from "../store/db.ts";
import { migrate } from "../store/migrate.ts";
import { UsageError } from "./args.ts";
import {
  CliError,
  type Command,
  checkNewPassphrase,
  isInitialised,
  JSON_OPTION,
  out,
  refuseInterruptedRestore,
  resolvePassphrase,
} from "./shared.ts";

export interface InitResult {
  dataDir: string;
  apiKeys: { live: string; test: string };
  /** Null when the passphrase came from LICENSING_KEYSTORE_PASSPHRASE. */
  passphraseFile: string | null;
  passphraseGenerated: boolean;
  /** The migrations applied to the new store. */
  migrations: string[];
}

/**
 * Creates store, keystore, workspace and two API keys. Everything is built in a staging folder
 * inside the data dir and then put into place, keystore last: a crash half-way leaves no
 * half-initialised data dir, and neither step replaces a file that appeared meanwhile, so an
 * existing keystore is never overwritten.
 */
export function initialise(config: Config): InitResult {
  const dataDir = config.dataDir;
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  refuseInterruptedRestore(dataDir);
  if (isInitialised(dataDir)) {
    throw new CliError(
      `${dataDir} is already initialised (it has a store or keystore); refusing to overwrite it`,
    );
  }
  const source = resolvePassphrase(config, { generate: true });
  checkNewPassphrase(source);
  const paths = dataPaths(dataDir);
  const staging = mkdtempSync(join(dataDir, ".init-"));
  try {
    const keystore = Keystore.create(join(staging, "keystore.json"), source.passphrase);
    const store = openStore(join(staging, "licensing.db"));
    let apiKeys: InitResult["apiKeys"];
    let migrations: string[];
    try {
      migrations = migrate(store.sqlite).applied;
      const deps = buildDeps(store, keystore);
      new WorkspaceService(deps).ensure();
      const service = new ApiKeyService(deps);
      const create = (environment: "live" | "test") =>
        service.create({ environment, scopes: [...SCOPES], name: `${environment} key (created by init)` })
          .apiKey;
      apiKeys = { live: create("live"), test: create("test") };
      // Folds the WAL into the main file so the single .db file is the whole store.
      const checkpoint = store.sqlite.query<{ busy: number }, []>("PRAGMA wal_checkpoint(TRUNCATE)").get();
      if (checkpoint?.busy !== 0) throw new Error("could not checkpoint the new store");
    } finally {
      store.close();
    }
    copyStore(join(staging, "licensing.db"), paths.store);
    place(join(staging, "keystore.json"), paths.keystore);
    fsyncDir(dataDir);
    return {
      dataDir,
      apiKeys,
      passphraseFile: source.file,
      passphraseGenerated: source.generated,
      migrations,
    };
  } finally {
    rmSync(staging, { recursive: true, force: true });
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
 * The store is copied, not linked: SQLite keeps per-inode state (its shared-memory WAL index) for
 * as long as any statement of the closed staging connection lives, and `serve` opens the store in
 * the same process right after init. Under a hard link that state would still name the staging
 * -shm file, and the server would never see writes made by other processes (the CLI).
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

export const initCommand: Command = {
  name: "init",
  summary:
    "Create a new data directory: store, sealed keystore, workspace, and one live and one test API key.",
  usage: "licensing init [--data-dir DIR] [--passphrase-file FILE] [--json]",
  configKeys: ["dataDir", "passphraseFile"],
  options: [JSON_OPTION],
  run(line) {
    if (line.positionals.length > 0) throw new UsageError(`unexpected argument ${line.positionals[0]}`);
    const result = initialise(line.config);
    if (line.flags.json === true) {
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
    } else {
      out(describeInit(result));
    }
    return 0;
  },
};
