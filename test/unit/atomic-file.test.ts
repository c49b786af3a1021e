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
