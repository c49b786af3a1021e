import { randomBytes } from "node:crypto";
import {
  closeSync,
  fsyncSync,
  lstatSync,
  openSync,
  realpathSync,
  renameSync,
  type Stats,
  statSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { constants } from "node:os";
import { dirname, join } from "node:path";
import { getSystemErrorMap } from "node:util";

/**
 * A file an {@link AtomicFile} could not write. The message is the reason alone, never the temp
 * file's name (which the operator never gave): the caller names the file as the operator gave it.
 */
export class FileWriteError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "FileWriteError";
  }
}

function reasonFor(error: unknown): string {
  const { code } = error as NodeJS.ErrnoException;
  if (code === "ENOENT" || code === "ENOTDIR") return "its directory does not exist";
  if (code === "EACCES" || code === "EPERM" || code === "EROFS") return "its directory is not writable";
  if (code === "ENAMETOOLONG") return "its name is too long";
  return systemDescription(error);
}

/** The system's description of a failure ("no space left on device"): Node's message names the path. */
export function systemDescription(error: unknown): string {
  const { errno } = error as NodeJS.ErrnoException;
  const described = errno === undefined ? undefined : getSystemErrorMap().get(errno)?.[1];
  return described ?? (error as Error).message;
}

const writeError = (error: unknown) => new FileWriteError(reasonFor(error), { cause: error });

/** What the rename would replace, when it is not a regular file; by `lstat`'s answer. */
function specialKind(entry: Stats): string | null {
  if (entry.isCharacterDevice()) return "a character device";
  if (entry.isBlockDevice()) return "a block device";
  if (entry.isFIFO()) return "a FIFO";
  if (entry.isSocket()) return "a socket";
  return null;
}

/**
 * The system's own trees: devices (`/dev`, whose `stdout` is a link the rename would replace, as
 * root) and kernel interfaces (`/proc`, `/sys`). Nothing anyone means as a file to write is there.
 */
const SYSTEM_TREES: Record<string, string> = {
  "/dev": "the system's devices",
  "/proc": "the kernel's process interface",
  "/sys": "the kernel's device interface",
};

/**
 * Ordinary file systems mounted inside /dev: shared memory, which containers use for scratch
 * files (a tmpfs), and POSIX message queues. Files written there are files.
 */
const FILE_SYSTEMS_IN_DEV = ["/dev/shm", "/dev/mqueue"];

const within = (path: string, tree: string) => path === tree || path.startsWith(`${tree}/`);

/** The system tree `dir` lies in, links followed; null for any other directory, or one not there. */
function systemTreeOf(dir: string): string | null {
  let real: string;
  try {
    real = realpathSync(dir);
  } catch {
    // No such directory: creating the temp file fails and says so.
    return null;
  }
  if (FILE_SYSTEMS_IN_DEV.some((tree) => within(real, tree))) return null;
  return Object.keys(SYSTEM_TREES).find((tree) => within(real, tree)) ?? null;
}

/**
 * Refuses a destination the rename must not replace. The rename would replace a device node, a
 * FIFO or a socket with a regular file (as root, `/dev/null` itself), which no one writing a file
 * means, so those are refused, and so is anything in /dev (but /dev/shm and /dev/mqueue), /proc or
 * /sys. A symbolic link is
 * replaced itself, never what it points to, as a rename does, but only when it leads to a regular
 * file or to nothing: a link to a device, a FIFO or a socket (`/dev/stdout` leads to a terminal or
 * a pipe) names that, and one leading to a directory is refused like the directory.
 */
function refuseSpecialFile(path: string): void {
  const tree = systemTreeOf(dirname(path));
  if (tree !== null)
    throw new FileWriteError(`it is in ${tree}, ${SYSTEM_TREES[tree]}, not a place for files`);
  let entry: Stats;
  try {
    entry = lstatSync(path);
  } catch (error) {
    // Nothing there yet is the usual case. Anything else (a name too long) would fail the
    // rename, after all the writing.
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
    throw writeError(error);
  }
  if (entry.isSymbolicLink()) {
    refuseLinkTarget(path);
    return;
  }
  // The rename at the end would fail on a directory.
  if (entry.isDirectory()) throw new FileWriteError("it is a directory");
  const kind = specialKind(entry);
  if (kind) throw new FileWriteError(`it is ${kind}, not a regular file`);
}

/**
 * Refuses a symbolic link unless it leads to a regular file or to nothing: a dangling link (or
 * one looping, or through a file) is replaced like any other entry, as the README says. One whose
 * target cannot be looked at (a directory this user cannot search) is refused: it may be anything.
 */
function refuseLinkTarget(link: string): void {
  let target: Stats;
  try {
    target = statSync(link);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ELOOP" || code === "ENOTDIR") return;
    throw new FileWriteError(
      `it is a symbolic link whose target cannot be checked (${systemDescription(error)})`,
    );
  }
  if (target.isDirectory()) throw new FileWriteError("it is a directory");
  const kind = specialKind(target);
  if (kind) throw new FileWriteError(`it is a symbolic link to ${kind}, not to a regular file`);
}

/** Temp files created and not yet renamed or removed: what a signal leaves to clean up. */
const pending = new Set<string>();

/**
 * A file that appears under its name only whole: written to a temp file beside it, fsynced, then
 * renamed over it (one directory, so one file system and an atomic rename), and the directory
 * fsynced, so a file reported written is still there after a power loss. The temp file's name
 * is short, so a destination name near the system's limit still fits, and random and created
 * exclusively, so two runs writing one destination never share it (in containers every run may be
 * PID 1); only a temp file this object created is ever removed.
 */
export class AtomicFile {
  private readonly temp: string;
  private fd: number | null;

  /**
   * Creates the temp file, or refuses (FileWriteError) a destination that cannot be written, or
   * that is something other than a file: a directory, a device, a FIFO or a socket.
   */
  constructor(readonly path: string) {
    refuseSpecialFile(path);
    this.temp = join(dirname(path), `.licensing-${randomBytes(8).toString("hex")}.tmp`);
    try {
      this.fd = openSync(this.temp, "wx", 0o644);
    } catch (error) {
      throw writeError(error);
    }
    pending.add(this.temp);
  }

  /** Appends `bytes`; on failure the temp file is removed. */
  write(bytes: Uint8Array): void {
    if (this.fd === null) throw new Error("the file was already committed or discarded");
    try {
      for (let done = 0; done < bytes.length; ) done += writeSync(this.fd, bytes, done);
    } catch (error) {
      this.discard();
      throw writeError(error);
    }
  }

  /** fsync, close, rename: the file is in place, whole. On failure the temp file is removed. */
  commit(): void {
    if (this.fd === null) throw new Error("the file was already committed or discarded");
    try {
      fsyncSync(this.fd);
      closeSync(this.fd);
      this.fd = null;
      renameSync(this.temp, this.path);
    } catch (error) {
      this.discard();
      throw writeError(error);
    }
    pending.delete(this.temp);
    completedWhileArmed?.push(this.path);
    syncDirectory(dirname(this.path));
  }

  /** Closes and removes the temp file, leaving the destination as it was; again, it does nothing. */
  discard(): void {
    if (this.fd !== null) {
      try {
        closeSync(this.fd);
      } catch {
        // Closed is all that matters here.
      }
      this.fd = null;
    }
    if (!pending.delete(this.temp)) return;
    try {
      unlinkSync(this.temp);
    } catch {
      // Removed by someone else: nothing of ours is left.
    }
  }
}

/**
 * Makes a rename in `dir` durable. The file is whole and in place already, so a directory that
 * cannot be opened for it (some file systems refuse) is not a failed write.
 */
function syncDirectory(dir: string): void {
  let fd: number;
  try {
    fd = openSync(dir, "r");
  } catch {
    return;
  }
  try {
    fsyncSync(fd);
  } catch {
    // As above: the rename happened; only its durability across a power loss is not confirmed.
  } finally {
    closeSync(fd);
  }
}

/**
 * The signals that end a long write: Ctrl-C, kill's default, a closed terminal or dropped SSH
 * session, Ctrl-\ (SIGQUIT). By default each ends the process at once, and a seal of gigabytes leaves its
 * partial file behind.
 */
const ENDING_SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"] as const;

/** The files put in place while removeTempFilesOnSignals is armed; null while it is not. */
let completedWhileArmed: string[] | null = null;

/**
 * Until the returned function is called, SIGINT, SIGTERM, SIGHUP and SIGQUIT remove the temp files
 * not yet renamed or removed and end the process with the shell's status for the signal (130, 143,
 * 129, 131). A file already in place (the signal came during its last fsync, or after) is whole
 * and stays; `command` (`licensing seal`) then says so on stderr, since the status alone reads as
 * "interrupted". The handler runs when the event loop turns, so the writer must await (its reads,
 * say) as it goes. SIGKILL cannot be handled: it leaves the `.licensing-<hex>.tmp` file.
 */
export function removeTempFilesOnSignals(command: string): () => void {
  const completed: string[] = [];
  completedWhileArmed = completed;
  const stop = (signal: NodeJS.Signals) => {
    for (const temp of pending) {
      try {
        unlinkSync(temp);
      } catch {
        // Gone already: nothing left to remove.
      }
    }
    for (const path of completed) {
      try {
        // Synchronous: the process ends on the next line, before a queued write would go out.
        writeSync(2, `${command}: stopped by ${signal} after ${path} was complete; the file is kept\n`);
      } catch {
        // No stderr to tell: the file is whole either way.
      }
    }
    process.exit(128 + constants.signals[signal]);
  };
  for (const signal of ENDING_SIGNALS) process.on(signal, stop);
  return () => {
    for (const signal of ENDING_SIGNALS) process.off(signal, stop);
    if (completedWhileArmed === completed) completedWhileArmed = null;
  };
}
