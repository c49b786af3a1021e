import { afterEach, beforeEach, expect, test } from "bun:test";
import {
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AtomicFile, FileWriteError } from "../../src/fs/atomic-file.ts";

/** Links at the destination: the rename replaces the link itself, whatever it leads to. */
let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "atomic-file-"));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const written = (path: string) => {
  const file = new AtomicFile(path);
  file.write(new TextEncoder().encode("package"));
  file.commit();
  return { isFile: lstatSync(path).isFile(), content: readFileSync(path, "utf8") };
};

test("a link that loops, leads through a file, or leads nowhere is replaced like any link", () => {
  symlinkSync(join(dir, "loop.zip"), join(dir, "loop.zip"));
  writeFileSync(join(dir, "plain"), "kept");
  symlinkSync(join(dir, "plain", "below"), join(dir, "through-file.zip"));
  symlinkSync(join(dir, "missing"), join(dir, "dangling.zip"));
  for (const name of ["loop.zip", "through-file.zip", "dangling.zip"]) {
    expect({ name, ...written(join(dir, name)) }).toEqual({ name, isFile: true, content: "package" });
  }
  expect(readFileSync(join(dir, "plain"), "utf8")).toBe("kept");
});

test("a link leading to a directory is refused like the directory, and nothing is left beside it", () => {
  mkdirSync(join(dir, "folder"));
  symlinkSync(join(dir, "folder"), join(dir, "folder-link.zip"));
  expect(() => new AtomicFile(join(dir, "folder-link.zip"))).toThrow(FileWriteError);
  expect(() => new AtomicFile(join(dir, "folder"))).toThrow("it is a directory");
  expect(lstatSync(join(dir, "folder-link.zip")).isSymbolicLink()).toBe(true);
  expect(readdirSync(dir).sort()).toEqual(["folder", "folder-link.zip"]);
});

/** Runs `body` in a child process with AtomicFile and removeTempFilesOnSignals in scope. */
function inChild(body: string) {
  const script = join(dir, "child.ts");
  const module = join(import.meta.dir, "../../src/fs/atomic-file.ts");
  writeFileSync(
    script,
    `import { AtomicFile, removeTempFilesOnSignals } from ${JSON.stringify(module)};\n${body}`,
  );
  const run = Bun.spawnSync([process.execPath, script], {
    cwd: dir,
    stderr: "pipe",
    env: { PATH: Bun.env.PATH },
  });
  return { code: run.exitCode, signal: run.signalCode ?? null, stderr: run.stderr.toString() };
}

test.each([
  ["SIGINT", 130],
  ["SIGTERM", 143],
  ["SIGHUP", 129],
  ["SIGQUIT", 131],
] as const)("%s while a file is half-written removes its temp file and exits %d", (signal, status) => {
  const run = inChild(`
    removeTempFilesOnSignals("licensing seal");
    const file = new AtomicFile(${JSON.stringify(join(dir, "out.sealed"))});
    file.write(new Uint8Array(1000));
    process.kill(process.pid, ${JSON.stringify(signal)});
    // The handler runs once the event loop turns; it ends the process before this does.
    await new Promise((resolve) => setTimeout(resolve, 10_000));
  `);
  expect(run).toEqual({ code: status, signal: null, stderr: "" });
  expect(readdirSync(dir)).toEqual(["child.ts"]);
});

test("a signal after the file was put in place keeps it, whole, and says so", () => {
  const out = join(dir, "out.sealed");
  const run = inChild(`
    removeTempFilesOnSignals("licensing seal");
    const file = new AtomicFile(${JSON.stringify(out)});
    file.write(new TextEncoder().encode("whole"));
    file.commit();
    // As a signal during the final fsync is handled: after the rename, when the loop turns.
    process.kill(process.pid, "SIGINT");
    await new Promise((resolve) => setTimeout(resolve, 10_000));
  `);
  expect(run).toEqual({
    code: 130,
    signal: null,
    stderr: `licensing seal: stopped by SIGINT after ${out} was complete; the file is kept\n`,
  });
  expect(readFileSync(out, "utf8")).toBe("whole");
  expect(readdirSync(dir).sort()).toEqual(["child.ts", "out.sealed"]);
});
