import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * Commands that work on an existing install, run where there is none (the usual case: no
 * --data-dir, from a directory without ./data). They must say so, not blame the passphrase or
 * send the operator to `licensing init`, which would make a new, empty install.
 */
const work = mkdtempSync(join(tmpdir(), "missing-data-dir-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const advice =
  ': pass --data-dir or LICENSING_DATA_DIR with the server\'s data directory, or run "licensing init" to make a new one';

/**
 * One of each kind of command that opens an existing store or keystore, with flags it accepts.
 * `offline issue` checks its request file first, so it is tried in offline-cli.test.ts, which has
 * a device to make one.
 */
const COMMANDS: string[][] = [
  ["billing", "status"],
  ["billing", "offering", "list"],
  ["backup", "backups/one"],
  ["keys", "list"],
  ["plan", "show"],
  ["signing-keys", "list", "--product", "prod_01JZ8X4M6Q2T9V3B7N5K1R0W8Y"],
  ["sealing-keys", "list", "--product", "prod_01JZ8X4M6Q2T9V3B7N5K1R0W8Y"],
];

function place(name: string): string {
  const cwd = join(work, name);
  mkdirSync(cwd);
  return cwd;
}

describe("a command run where no data directory is", () => {
  for (const args of COMMANDS) {
    const name = args.slice(0, 2).join(" ");
    test(`${name} without --data-dir names the missing ./data instead of the passphrase, and creates nothing`, async () => {
      const cwd = place(`bare-${args.join("-").replace(/\W+/g, "_")}`);
      const result = await runInProcess(args, cwd);
      expect(result.code).toBe(1);
      expect(result.stdout).toBe("");
      const prefix = `licensing ${args[0] === "backup" ? "backup" : name}:`;
      expect(result.stderr).toBe(
        `${prefix} no data directory at ${join(cwd, "data")} (nothing initialised there)${advice}\n`,
      );
      expect(existsSync(join(cwd, "data"))).toBe(false);
      expect(readdirSync(cwd)).toEqual([]);
    });
  }

  test("a passphrase in LICENSING_KEYSTORE_PASSPHRASE does not turn it into advice to run init", async () => {
    const cwd = place("with-passphrase");
    for (const args of COMMANDS) {
      const result = await runInProcess(args, cwd, {
        LICENSING_KEYSTORE_PASSPHRASE: "a long enough passphrase",
      });
      expect(result.code).toBe(1);
      expect(result.stderr).toContain(
        `no data directory at ${join(cwd, "data")} (nothing initialised there)`,
      );
      expect(result.stderr).not.toContain("keystore");
    }
  });

  test("LICENSING_DATA_DIR pointing at an empty directory is named, and left empty", async () => {
    const cwd = place("empty-dir");
    const empty = join(cwd, "elsewhere");
    mkdirSync(empty);
    for (const args of COMMANDS) {
      const result = await runInProcess(args, cwd, { LICENSING_DATA_DIR: empty });
      expect(result.code).toBe(1);
      expect(result.stderr).toEndWith(
        `no data directory at ${empty} (it holds neither a store nor a keystore)${advice}\n`,
      );
      expect(readdirSync(empty)).toEqual([]);
    }
  });

  test("a data directory a restore left unfinished gets the restore's advice instead", async () => {
    const cwd = place("restore-left");
    mkdirSync(join(cwd, "data", ".restore-abc"), { recursive: true });
    const result = await runInProcess(["keys", "list"], cwd);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(`a restore into ${join(cwd, "data")} did not finish`);
  });

  test("init still makes a new install in a directory that does not exist", async () => {
    const cwd = place("init-works");
    const made = await runInProcess(["init", "--json"], cwd);
    expect(made.code).toBe(0);
    expect(existsSync(join(cwd, "data", "keystore.json"))).toBe(true);
    const listed = await runInProcess(["keys", "list", "--json"], cwd);
    expect(listed.code).toBe(0);
    expect(JSON.parse(listed.stdout)).toHaveLength(2);
  });
});
