import { closeSync, openSync, readSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { dataPaths } from "../config.ts";
import { CliError } from "./console.ts";
import { leftoverFolders } from "./shared.ts";

/** Where a first start builds the data dir's files before linking them into place. */
export const INIT_STAGING_PREFIX = ".init-";

/** The names of the files in an `.init-*` folder. */
export const STAGED = {
  keystore: "keystore.json",
  /** The store as SQLite left it; what a placed store is compared with. */
  store: "licensing.db",
  /** A copy of `store` under a new inode, which is what gets linked into place (init.ts says why). */
  storeToPlace: "licensing.db.placed",
  /** Only when the passphrase was generated. */
  passphrase: "keystore.passphrase",
} as const;

const sizeOf = (path: string): number | null => {
  try {
    return statSync(path).size;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
};

/** Whether `placed`'s bytes are the first bytes of `staged` (all of them, or a copy cut short). */
function isStart(placed: string, staged: string, whole: boolean): boolean {
  const placedSize = sizeOf(placed);
  const stagedSize = sizeOf(staged);
  if (placedSize === null || stagedSize === null) return false;
  if (whole ? placedSize !== stagedSize : placedSize > stagedSize) return false;
  // Compared in chunks: a store is small when new, but this may be a large one that is not ours.
  const chunk = 64 * 1024;
  const a = Buffer.alloc(chunk);
  const b = Buffer.alloc(chunk);
  const fa = openSync(placed, "r");
  try {
    const fb = openSync(staged, "r");
    try {
      for (let at = 0; at < placedSize; at += chunk) {
        const length = Math.min(chunk, placedSize - at);
        if (readSync(fa, a, 0, length, at) !== length || readSync(fb, b, 0, length, at) !== length)
          return false;
        if (!a.subarray(0, length).equals(b.subarray(0, length))) return false;
      }
      return true;
    } finally {
      closeSync(fb);
    }
  } finally {
    closeSync(fa);
  }
}

/**
 * Whether the data dir's store, if there is one, is what the folder `staging` put there: still the
 * staged one byte for byte, or a part of it (earlier versions copied it into place, and could be
 * stopped mid-copy), and nothing was written to it since (its write-ahead log is empty or absent).
 */
function storePlacedFrom(dataDir: string, staging: string): boolean {
  const { store } = dataPaths(dataDir);
  if (sizeOf(store) === null) return true;
  return isStart(store, join(staging, STAGED.store), false) && (sizeOf(`${store}-wal`) ?? 0) === 0;
}

/** True when the folder staged the passphrase the data dir holds. */
const stagedPassphrase = (dataDir: string, staging: string): boolean =>
  sizeOf(join(staging, STAGED.passphrase)) !== null &&
  isStart(dataPaths(dataDir).passphrase, join(staging, STAGED.passphrase), true);

/**
 * Clears what a first start that was cut short left in `dataDir`, and says what it did (one line
 * each, for stderr). Call it holding the data dir's serve lock: an `.init-*` folder is a leftover
 * only when no process is still working in it.
 *
 * SIGINT, SIGTERM, SIGHUP and SIGQUIT are held while a first start runs, so only kill -9, a crash or
 * a power loss stop it half-way. `initialise` builds every file in an `.init-*` folder, links them
 * into place in this order: a generated passphrase, the store, the keystore; and removes the folder
 * once the API keys are printed. So wherever it stopped, the data dir holds one of:
 * - the folder alone: nothing was placed; the folder goes and the start begins anew;
 * - the folder and, without the keystore, some of the files it placed, each still as staged:
 *   they go (a store is no use without its keystore, and its API keys were never shown), then
 *   the folder, and the start begins anew, with new keys and a new passphrase that it announces;
 * - everything placed and the folder: the install is whole; the folder goes, with a warning that
 *   its API keys may never have been shown.
 * A passphrase file the folder did not stage is the operator's, and stays. Anything else beside a
 * folder (a store that is not the staged one, or was written to since) is not the first start's
 * to remove: it is refused, and nothing is removed. What is removed goes in the reverse order of
 * placing, the folder last, so a clean-up cut short leaves one of these states again.
 */
export function clearInterruptedInit(dataDir: string): string[] {
  const leftovers = leftoverFolders(dataDir, INIT_STAGING_PREFIX).map((name) => join(dataDir, name));
  if (leftovers.length === 0) return [];
  const paths = dataPaths(dataDir);
  const removeFolders = () => {
    for (const folder of leftovers) rmSync(folder, { recursive: true, force: true });
  };
  if (sizeOf(paths.keystore) !== null) {
    const placedLast = leftovers.some((folder) =>
      isStart(paths.keystore, join(folder, STAGED.keystore), true),
    );
    removeFolders();
    if (!placedLast) return [];
    return [
      `warning: the first start of ${dataDir} was stopped after it set the directory up, maybe before it ` +
        'printed the new API keys; if you have none, create one with "licensing keys create"',
    ];
  }
  const owner = leftovers.find((folder) => storePlacedFrom(dataDir, folder));
  if (owner === undefined) {
    throw new CliError(
      `${dataDir} holds ${leftovers.join(", ")}, left by a first start that did not finish, and a store ` +
        `without a keystore that is not the one it made, or was written to since; nothing was removed. ` +
        `If ${paths.store} holds nothing you need, delete it and the folder and start again; ` +
        "otherwise restore the data directory from a backup",
    );
  }
  const removed: string[] = [];
  if (sizeOf(paths.store) !== null) {
    for (const file of [`${paths.store}-wal`, `${paths.store}-shm`, paths.store])
      rmSync(file, { force: true });
    removed.push(paths.store);
  }
  if (stagedPassphrase(dataDir, owner)) {
    rmSync(paths.passphrase, { force: true });
    removed.push(paths.passphrase);
  }
  removeFolders();
  return [
    `an earlier first start of ${dataDir} was stopped before it finished; removed what it left ` +
      `(${[...removed, ...leftovers].join(", ")}) and starting again`,
  ];
}
