import { Database } from "bun:sqlite";
import { randomBytes } from "node:crypto";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { dirname, join, resolve } from "node:path";
import pkg from "../../package.json" with { type: "json" };
import { type Config, dataPaths } from "../config.ts";
import { Keystore, KeystoreError } from "../crypto/keystore.ts";
import {
  BACKUP_FORMAT,
  type BackupManifest,
  checkStore,
  describeFile,
  fsyncFile,
  MANIFEST_NAME,
  snapshotStore,
} from "../store/backup.ts";
import { UsageError } from "./args.ts";
import { CliError, err, out } from "./console.ts";
import { fsyncDir } from "./init.ts";
import { readSecretLine, resolvePassphrase } from "./secrets.ts";
import { type Command, JSON_OPTION, requireInitialised, withinDataDir } from "./shared.ts";

export const STORE = "licensing.db";
export const KEYSTORE = "keystore.json";
export const PASSPHRASE = "keystore.passphrase";

export interface BackupResult {
  dir: string;
  manifest: BackupManifest;
}

/**
 * Store first, keystore second: each key enters the keystore before the store mentions it, and
 * only keys the store already calls compromised ever leave it, so a keystore copied after the
 * snapshot has every key the snapshot needs (checkStore says so when a compromise fell between).
 * Everything is written to a sibling `.partial-*` folder and renamed into place last, so a backup
 * that was interrupted never looks complete.
 */
export function takeBackup(
  config: Config,
  outDir: string,
  options: { includePassphrase: boolean },
): BackupResult {
  requireInitialised(config.dataDir);
  const paths = dataPaths(config.dataDir);
  for (const [what, path] of [
    ["store", paths.store],
    ["keystore", paths.keystore],
  ] as const) {
    if (!existsSync(path))
      throw new CliError(`no ${what} at ${path}; is ${config.dataDir} a data directory?`);
  }
  refuseInsideDataDir(outDir, config.dataDir);
  const { passphrase } = resolvePassphrase(config);
  if (existsSync(outDir) && (!statSync(outDir).isDirectory() || readdirSync(outDir).length > 0)) {
    throw new CliError(`${outDir} exists and is not an empty directory; choose a new place for the backup`);
  }
  mkdirSync(dirname(outDir), { recursive: true, mode: 0o700 });
  const staging = `${outDir}.partial-${process.pid}-${randomBytes(4).toString("hex")}`;
  mkdirSync(staging, { mode: 0o700 });
  try {
    const createdAt = new Date().toISOString();
    snapshotStore(paths.store, join(staging, STORE));
    chmodSync(join(staging, STORE), 0o600);
    writeFileSync(join(staging, KEYSTORE), readFileSync(paths.keystore), { mode: 0o600, flag: "wx" });
    fsyncFile(join(staging, KEYSTORE));
    const keystore = openVerified(join(staging, KEYSTORE), passphrase, "the data directory's keystore");
    const report = readOnly(join(staging, STORE), (sqlite) => checkStore(sqlite, keystore));
    if (options.includePassphrase) {
      writeFileSync(join(staging, PASSPHRASE), `${passphrase}\n`, { mode: 0o600, flag: "wx" });
      fsyncFile(join(staging, PASSPHRASE));
      proveRestorable(staging, passphrase);
    }
    const files: BackupManifest["files"] = {};
    for (const name of [STORE, KEYSTORE, ...(options.includePassphrase ? [PASSPHRASE] : [])]) {
      files[name] = describeFile(join(staging, name));
    }
    const manifest: BackupManifest = {
      format: BACKUP_FORMAT,
      created_at: createdAt,
      licensing_version: pkg.version,
      schema: report.schema,
      files,
      rows: report.rows,
      passphrase_included: options.includePassphrase,
    };
    writeFileSync(join(staging, MANIFEST_NAME), `${JSON.stringify(manifest, null, 2)}\n`, { mode: 0o600 });
    fsyncFile(join(staging, MANIFEST_NAME));
    fsyncDir(staging);
    // rename(2) replaces an empty directory and fails on a non-empty one: no backup is overwritten.
    renameSync(staging, outDir);
    fsyncDir(dirname(outDir));
    return { dir: outDir, manifest };
  } catch (error) {
    rmSync(staging, { recursive: true, force: true });
    throw error;
  }
}

/**
 * A backup in the data directory is refused, as `offline issue` refuses a package there: the
 * directory holds only the service's own files, and some names break the install (a
 * `.restore-*` folder makes serve refuse to start, `keystore.json.lock` blocks keystore writes).
 * Links are followed, for OUT and for the data directory, so no other spelling gets past.
 */
function refuseInsideDataDir(outDir: string, dataDir: string): void {
  if (withinDataDir(outDir, dataDir)) {
    throw new CliError(
      `cannot write the backup to ${outDir}: it is in the data directory ${dataDir}, which holds only the service's own files`,
    );
  }
}

/**
 * The backup's passphrase file, read as restore reads it (trailing line breaks dropped), must open
 * the backup's keystore copy: a passphrase that ends in CR or LF (possible only from
 * LICENSING_KEYSTORE_PASSPHRASE, for a keystore sealed before init refused it) does not survive the
 * file, and a backup that restore cannot open must not be reported as written.
 */
function proveRestorable(staging: string, passphrase: string): void {
  let opens = false;
  try {
    const readBack = readSecretLine(join(staging, PASSPHRASE), "the passphrase file");
    // The same text already opened this keystore copy (openVerified): no second key derivation.
    if (readBack !== passphrase) Keystore.open(join(staging, KEYSTORE), readBack);
    opens = true;
  } catch (error) {
    if (!(error instanceof KeystoreError || error instanceof CliError)) throw error;
  }
  if (opens) return;
  const why = /[\r\n]$/.test(passphrase)
    ? "the passphrase ends in a line break (CR or LF), which a passphrase file cannot hold"
    : "the passphrase read back from the file does not open the keystore";
  throw new CliError(
    `cannot include the passphrase: ${why}, so restore could not open this backup; ` +
      "run the backup without --include-passphrase and keep the passphrase, exactly as it is, elsewhere",
  );
}

export function openVerified(path: string, passphrase: string, what: string): Keystore {
  try {
    return Keystore.open(path, passphrase);
  } catch (error) {
    if (error instanceof KeystoreError) throw new CliError(`${what} does not open: ${error.message}`);
    throw error;
  }
}

function readOnly<T>(path: string, work: (sqlite: Database) => T): T {
  const sqlite = new Database(path, { readonly: true });
  try {
    return work(sqlite);
  } finally {
    sqlite.close();
  }
}

/**
 * An absolute path without a trailing separator (`OUT/`, as tab completion writes a directory):
 * backup names its staging folder `${OUT}.partial-*`, which must land beside OUT, not inside it.
 */
export const resolvePath = (path: string, cwd: string) => resolve(cwd, path);

export function onePositional(positionals: readonly string[], what: string): string {
  const [first, extra] = positionals;
  if (first === undefined) throw new UsageError(`give the ${what}`);
  if (extra !== undefined) throw new UsageError(`unexpected argument ${extra}`);
  return first;
}

export const backupCommand: Command = {
  name: "backup",
  summary:
    "Write a consistent copy of the store and the keystore into a new directory, while the server runs. " +
    "The keystore is checked with the passphrase; the passphrase itself is left out unless asked for.",
  usage: "licensing backup OUT [--data-dir DIR] [--passphrase-file FILE] [--include-passphrase] [--json]",
  configKeys: ["dataDir", "passphraseFile"],
  options: [
    {
      name: "include-passphrase",
      kind: "boolean",
      description: "also copy the passphrase into the backup (whoever holds it then holds every key)",
    },
    JSON_OPTION,
  ],
  run(line, context) {
    const outDir = resolvePath(
      onePositional(line.positionals, "directory to write the backup to"),
      context.cwd,
    );
    const includePassphrase = line.flags["include-passphrase"] === true;
    const { dir, manifest } = takeBackup(line.config, outDir, { includePassphrase });
    if (line.flags.json === true) {
      out(JSON.stringify({ backup_dir: dir, ...manifest }));
    } else {
      const store = manifest.files[STORE];
      out(
        `Backup written to ${dir}: store ${store?.bytes ?? 0} bytes (schema ${manifest.schema.at(-1) ?? "none"}), keystore checked.`,
      );
    }
    if (!includePassphrase) err("The passphrase is not in the backup; keep it safe, restore needs it.");
    return 0;
  },
};

export const backupCommands = [backupCommand];
