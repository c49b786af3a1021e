import { accessSync, constants, statSync } from "node:fs";

const who = (): string => {
  const uid = typeof process.getuid === "function" ? process.getuid() : null;
  return uid === null ? "this user" : `this user (uid ${uid})`;
};

/** The owner and mode of `path`, for a message that says what to change. */
const ownership = (path: string): string => {
  try {
    const { uid, mode } = statSync(path);
    return `; it belongs to uid ${uid}, mode ${(mode & 0o7777).toString(8).padStart(4, "0")}`;
  } catch {
    return "";
  }
};

function refusal(path: string, named: string, error: unknown): string | null {
  const code = (error as NodeJS.ErrnoException).code;
  if (code === "ENOENT") return null;
  if (code === "EROFS") return `${named} ${path} is on a read-only file system`;
  if (code === "EACCES" || code === "EPERM") {
    return (
      `${named} ${path} is not writable by ${who()}${ownership(path)}: ` +
      "give it to the user that runs the service (chown), or run the service as its owner"
    );
  }
  throw error;
}

/**
 * Why this process cannot write the data directory `dir`, or those of `files` (paths in it) that
 * exist; null when it can, and when `dir` does not exist yet (whoever creates it says why it
 * cannot). Asked before anything is written: otherwise the first write to fail (the server's lock,
 * a generated passphrase) reports an error that blames that one file, even one that is not there.
 * access() asks the kernel with this process's ids, so a read-only mount and an immutable
 * directory count as well as modes.
 */
export function unwritableDataDir(dir: string, files: readonly string[]): string | null {
  try {
    // X_OK too: without search permission nothing in the directory can be opened.
    accessSync(dir, constants.W_OK | constants.X_OK);
  } catch (error) {
    return refusal(dir, "the data directory", error);
  }
  for (const file of files) {
    try {
      accessSync(file, constants.W_OK);
    } catch (error) {
      const refused = refusal(file, "the file", error);
      if (refused) return refused;
    }
  }
  return null;
}
