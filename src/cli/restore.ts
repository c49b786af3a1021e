import {
  chmodSync,
  closeSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { basename, join } from "node:path";
import { CONFIG_OPTIONS, type Config, dataPaths } from "../config.ts";
import {
  type BackupManifest,
  checkStore,
  describeFile,
  fsyncFile,
  MANIFEST_NAME,
  parseManifest,
} from "../store/backup.ts";
import { openStore, type Store, unusableStoreFile } from "../store/db.ts";
import { migrate } from "../store/migrate.ts";
import { takeServeLock } from "../store/serve-lock.ts";
import { UsageError } from "./args.ts";
import { KEYSTORE, onePositional, openVerified, PASSPHRASE, resolvePath, STORE } from "./backup.ts";
import { CliError, err, out } from "./console.ts";
import { copyStore, fsyncDir, place } from "./init.ts";
import { readSecretLine, resolvePassphrase } from "./secrets.ts";
import { type Command, JSON_OPTION, leftoverRestores, RESTORE_STAGING_PREFIX } from "./shared.ts";

/** The only names a backup may hold, so a doctored manifest cannot make restore read elsewhere. */
const KNOWN_FILES = new Set([STORE, KEYSTORE, PASSPHRASE]);

export interface RestoreResult {
  dataDir: string;
  schema: string[];
  applied: string[];
  /** Where serve finds the passphrase by default; null when the operator gave it another way. */
  passphraseFile: string | null;
  /** Staging folders of earlier restores that did not finish, removed once this one was in place. */
  cleared: string[];
}

/**
 * Checks the whole backup (checksums, keystore with the passphrase, store integrity, keys the
 * store needs, migrations) in a staging folder inside the target, and only then puts the files in
 * place, keystore last, as `init` does. The target must be new or empty: nothing is overwritten.
 * The staging folder is inside the target, so a restore that dies leaves a directory `serve` and
 * `init` refuse (shared.ts) rather than one that looks like a fresh volume.
 */
export function restoreBackup(
  config: Config,
  inDir: string,
  writes: TargetWrites = FILE_SYSTEM,
): RestoreResult {
  const manifest = readManifest(inDir);
  const dataDir = config.dataDir;
  const cleared = checkTarget(dataDir);
  const fromBackup = config.passphraseFile === null && config.passphrase === null;
  if (fromBackup && !manifest.files[PASSPHRASE]) {
    throw new CliError(
      "the backup holds no passphrase; give the one its keystore was sealed with " +
        "(--passphrase-file, LICENSING_KEYSTORE_PASSPHRASE_FILE or LICENSING_KEYSTORE_PASSPHRASE)",
    );
  }
  const passphrase = fromBackup
    ? readSecretLine(join(inDir, PASSPHRASE), "the backup's passphrase file")
    : resolvePassphrase(config).passphrase;
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  // Emptied now, for the space they take; removed only once this restore has put its files in
  // place, so a restore that fails again still leaves a directory that serve refuses.
  for (const name of cleared) {
    const folder = join(dataDir, name);
    for (const entry of readdirSync(folder)) rmSync(join(folder, entry), { recursive: true, force: true });
  }
  const paths = dataPaths(dataDir);
  const staging = mkdtempSync(join(dataDir, RESTORE_STAGING_PREFIX));
  try {
    copyFileSync(join(inDir, STORE), join(staging, STORE));
    copyFileSync(join(inDir, KEYSTORE), join(staging, KEYSTORE));
    chmodSync(join(staging, KEYSTORE), 0o600);
    const keystore = openVerified(join(staging, KEYSTORE), passphrase, "the backup's keystore");
    const store = openBackupStore(join(staging, STORE));
    let applied: string[];
    let schema: string[];
    try {
      checkStore(store.sqlite, keystore);
      try {
        applied = migrate(store.sqlite).applied;
      } catch (error) {
        throw new CliError(`cannot restore this backup: ${(error as Error).message}`);
      }
      schema = checkStore(store.sqlite, keystore).schema;
      // One self-contained file before it is copied into place, as init leaves it.
      store.sqlite.run("PRAGMA wal_checkpoint(TRUNCATE)");
    } catch (error) {
      if (error instanceof CliError) throw error;
      throw new CliError(`the backup's store cannot be used: ${(error as Error).message}`);
    } finally {
      store.close();
    }
    putInPlace(staging, dataDir, fromBackup ? passphrase : null, writes);
    if (cleared.length > 0) {
      for (const name of cleared) rmSync(join(dataDir, name), { recursive: true, force: true });
      fsyncDir(dataDir);
    }
    return {
      dataDir,
      schema,
      applied,
      passphraseFile: fromBackup ? paths.passphrase : null,
      cleared: cleared.map((name) => join(dataDir, name)),
    };
  } finally {
    rmSync(staging, { recursive: true, force: true });
  }
}

/**
 * The backup's store copy, opened for the checks. A file that is not SQLite, or whose pages SQLite
 * refuses at once, is reported as the backup's store, not with SQLite's bare reason.
 */
function openBackupStore(path: string): Store {
  const unusable = unusableStoreFile(path);
  if (unusable) throw new CliError(`the backup's store ${unusable}; restore another backup`);
  try {
    return openStore(path);
  } catch (error) {
    throw new CliError(`the backup's store cannot be used: ${(error as Error).message}`);
  }
}

/**
 * The calls that write the restored files into the target: node's, replaced only by tests that
 * make them fail part-way, as a full disk does (a small enough volume needs root to mount).
 */
export interface TargetWrites {
  copyFile: typeof copyFileSync;
  writeFile: typeof writeFileSync;
}
const FILE_SYSTEM: TargetWrites = { copyFile: copyFileSync, writeFile: writeFileSync };

/**
 * Store, keystore last as `init` does, then the passphrase when it came from the backup. Nothing
 * is overwritten (each file is created exclusively). A step that fails, above all for want of
 * space (the store is copied a second time here), takes out what the steps before it put in
 * place, and copyStore what it wrote itself: the target is left as it was, and the restore can
 * simply be run again once there is room.
 */
function putInPlace(staging: string, dataDir: string, passphrase: string | null, writes: TargetWrites): void {
  const paths = dataPaths(dataDir);
  const placed: string[] = [];
  try {
    copyStore(join(staging, STORE), paths.store, writes.copyFile);
    placed.push(paths.store);
    place(join(staging, KEYSTORE), paths.keystore);
    placed.push(paths.keystore);
    if (passphrase !== null) {
      createExclusively(paths.passphrase);
      placed.push(paths.passphrase);
      writes.writeFile(paths.passphrase, `${passphrase}\n`);
      fsyncFile(paths.passphrase);
    }
    fsyncDir(dataDir);
  } catch (error) {
    for (const path of placed.reverse()) rmSync(path, { force: true });
    if (error instanceof CliError) throw error;
    throw new CliError(
      `cannot put the restored files into ${dataDir}: ${(error as Error).message}; ` +
        "nothing of this restore was left there: make room (restore needs about twice the store's size free) and run it again",
    );
  }
}

function createExclusively(path: string): void {
  try {
    closeSync(openSync(path, "wx", 0o600));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") {
      throw new CliError(`${path} appeared while restoring; refusing to overwrite it`);
    }
    throw error;
  }
}

/**
 * The target must be new or empty; the only things restore removes from it are the staging
 * folders of earlier restores that died before they put any file in place (the folder is all
 * they left). Returns their names. Beside a store, keystore or anything else such a folder means
 * the restore died while putting files in place, and what it placed is not known to be whole.
 */
function checkTarget(dataDir: string): string[] {
  if (!existsSync(dataDir)) return [];
  if (!statSync(dataDir).isDirectory()) throw new CliError(`${dataDir} is not a directory`);
  refuseRunningServer(dataDir);
  const leftovers = leftoverRestores(dataDir);
  // Lock files are all a stopped server or keystore command leaves that is not data: they do not
  // count, and neither does the empty lost+found of a freshly formatted volume mounted there.
  const lockName = basename(dataPaths(dataDir).serveLock);
  const others = readdirSync(dataDir).filter(
    (name) =>
      !leftovers.includes(name) &&
      name !== lockName &&
      !isEmptyKeystoreLock(dataDir, name) &&
      !isFreshLostAndFound(dataDir, name),
  );
  if (others.length === 0) return leftovers;
  if (leftovers.length > 0) {
    throw new CliError(
      `${dataDir} is not empty: it holds ${others.sort().join(", ")} beside ${leftovers.join(", ")}, ` +
        "left by a restore that did not finish; what it put in place may be incomplete: empty the directory and restore again",
    );
  }
  throw new CliError(`${dataDir} is not empty; restore only into a new or empty directory`);
}

/**
 * The keystore's write lock (crypto/file-lock.ts): an empty regular file that stays after every
 * write. One with content is not ours to ignore.
 */
function isEmptyKeystoreLock(dataDir: string, name: string): boolean {
  if (name !== `${basename(dataPaths(dataDir).keystore)}.lock`) return false;
  try {
    const stat = lstatSync(join(dataDir, name));
    return stat.isFile() && stat.size === 0;
  } catch {
    return false;
  }
}

/**
 * `lost+found`, as mkfs makes it at a volume's root: a real directory (not a link) with nothing in
 * it. One that fsck filled holds someone's files, and the directory is not a fresh volume.
 */
function isFreshLostAndFound(dataDir: string, name: string): boolean {
  if (name !== "lost+found") return false;
  const path = join(dataDir, name);
  try {
    return lstatSync(path).isDirectory() && readdirSync(path).length === 0;
  } catch {
    return false;
  }
}

/** A server running on the target would serve half a restore, or keep the old data in memory. */
function refuseRunningServer(dataDir: string): void {
  const lockPath = dataPaths(dataDir).serveLock;
  if (!existsSync(lockPath)) return;
  let lock: ReturnType<typeof takeServeLock>;
  try {
    lock = takeServeLock(lockPath);
  } catch {
    // Not a lock file SQLite can use: nothing holds it, and it is not data.
    return;
  }
  if (!lock) throw new CliError(`a licensing serve is running on ${dataDir}; stop it before restoring there`);
  lock.release();
}

function readManifest(inDir: string): BackupManifest {
  const manifestPath = join(inDir, MANIFEST_NAME);
  if (!existsSync(manifestPath)) {
    throw new CliError(`${inDir} has no ${MANIFEST_NAME}; give a directory written by "licensing backup"`);
  }
  let manifest: BackupManifest;
  try {
    manifest = parseManifest(readFileSync(manifestPath, "utf8"));
  } catch (error) {
    throw new CliError(`${inDir}: ${(error as Error).message}`);
  }
  for (const name of Object.keys(manifest.files)) {
    if (!KNOWN_FILES.has(name)) throw new CliError(`${MANIFEST_NAME} lists an unknown file "${name}"`);
  }
  for (const name of [STORE, KEYSTORE]) {
    if (!manifest.files[name]) throw new CliError(`${MANIFEST_NAME} does not list ${name}`);
  }
  for (const [name, expected] of Object.entries(manifest.files)) {
    const path = join(inDir, name);
    if (!existsSync(path)) throw new CliError(`${path} is missing; the backup is incomplete`);
    const actual = describeFile(path);
    if (actual.sha256 !== expected.sha256 || actual.bytes !== expected.bytes) {
      throw new CliError(`${path} does not match its checksum in ${MANIFEST_NAME}; the backup is damaged`);
    }
  }
  return manifest;
}

export const restoreCommand: Command = {
  name: "restore",
  summary:
    "Restore a backup into a new or empty data directory, after checking it: checksums, the keystore " +
    "with the passphrase, the store's integrity and migrations.",
  usage: "licensing restore IN --data-dir DIR [--passphrase-file FILE] [--json]",
  // --data-dir is the shared option (its flag and variable feed config.dataDir) with its own
  // help: for restore it has no default.
  configKeys: ["passphraseFile"],
  options: [
    {
      ...CONFIG_OPTIONS.dataDir,
      description: "the new or empty data directory to restore into (required)",
    },
    JSON_OPTION,
  ],
  run(line, context) {
    const inDir = resolvePath(onePositional(line.positionals, "backup directory to restore"), context.cwd);
    // The default ./data depends on the directory the shell happens to be in: a forgotten flag
    // would restore there, and `serve` on the real data directory would go on with the old store.
    if (typeof line.flags["data-dir"] !== "string" && !context.env[CONFIG_OPTIONS.dataDir.env])
      throw new UsageError(
        `--data-dir (or ${CONFIG_OPTIONS.dataDir.env}) is required: the new or empty directory to restore into`,
      );
    const result = restoreBackup(line.config, inDir);
    for (const path of result.cleared)
      err(`Removed ${path}, left by an earlier restore that did not finish.`);
    if (line.flags.json === true) {
      out(
        JSON.stringify({
          data_dir: result.dataDir,
          schema: result.schema,
          applied: result.applied,
          passphrase_file: result.passphraseFile,
        }),
      );
    } else {
      out(
        `Restored into ${result.dataDir} (schema ${result.schema.at(-1) ?? "none"}` +
          `${result.applied.length > 0 ? `, migrated: ${result.applied.join(", ")}` : ""}). ` +
          `Start it with: ${serveHint(result, line.config)}`,
      );
    }
    return 0;
  },
};

/**
 * The serve command that starts the restored data dir. A passphrase left out of the backup is not
 * in the data dir either, so serve needs the same source restore used, or it fails to start.
 */
export function serveHint(result: RestoreResult, config: Config): string {
  const command = `licensing serve --data-dir ${shellWord(result.dataDir)}`;
  if (result.passphraseFile !== null) return command;
  if (config.passphraseFile !== null)
    return `${command} --passphrase-file ${shellWord(config.passphraseFile)}`;
  // Never the passphrase itself on a command line (shell history, ps).
  return `${command} (with LICENSING_KEYSTORE_PASSPHRASE set, as for this restore)`;
}

/** A path as one shell word, so the hint can be pasted as printed. */
const shellWord = (word: string): string =>
  /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", "'\\''")}'`;

export const restoreCommands = [restoreCommand];
