import { expect } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { CliError } from "../../src/cli/console.ts";
import { describeFile } from "../../src/store/backup.ts";

/** Rewrites a backup's manifest checksums after a test altered its files on purpose. */
export function reseal(dir: string): void {
  const manifest = JSON.parse(readFileSync(join(dir, "backup.json"), "utf8"));
  for (const name of Object.keys(manifest.files)) manifest.files[name] = describeFile(join(dir, name));
  writeFileSync(join(dir, "backup.json"), JSON.stringify(manifest));
}

/** `work` fails with a CliError (the one-line kind an operator sees) whose message matches. */
export function expectCliError(work: () => unknown, message: RegExp): void {
  let thrown: unknown;
  try {
    work();
  } catch (error) {
    thrown = error;
  }
  expect(thrown).toBeInstanceOf(CliError);
  expect((thrown as Error).message).toMatch(message);
}
