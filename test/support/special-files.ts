import { lstatSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { join } from "node:path";

/** A name in a directory that is not a regular file, and how AtomicFile names its kind. */
export interface SpecialFile {
  name: string;
  kind: string;
}

/**
 * A FIFO, a Unix socket and (where this process may make one: root, as in the test containers) a
 * character device with /dev/null's numbers, made in `dir` under names ending in `suffix`: what
 * a write by rename must never replace. `close` stops the socket's listener.
 */
export async function makeSpecialFiles(
  dir: string,
  suffix: string,
): Promise<{ files: SpecialFile[]; close: () => Promise<void> }> {
  const files: SpecialFile[] = [];
  const fifo = `pipe${suffix}`;
  if (Bun.spawnSync(["mkfifo", join(dir, fifo)]).exitCode !== 0) throw new Error("mkfifo failed");
  files.push({ name: fifo, kind: "a FIFO" });
  const socket = `socket${suffix}`;
  const server: Server = createServer();
  await new Promise<void>((resolve) => server.listen(join(dir, socket), resolve));
  files.push({ name: socket, kind: "a socket" });
  const device = `null${suffix}`;
  if (Bun.spawnSync(["mknod", join(dir, device), "c", "1", "3"]).exitCode === 0)
    files.push({ name: device, kind: "a character device" });
  return {
    files,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** Whether `path` is still the kind of file it was made as (never replaced by a regular file). */
export function stillSpecial(path: string): boolean {
  const entry = lstatSync(path);
  return entry.isFIFO() || entry.isSocket() || entry.isCharacterDevice();
}
