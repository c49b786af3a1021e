import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MAX_SECRET_FILE_BYTES, readBoundedFile } from "../../src/cli/secrets.ts";
import { openKeystore } from "../../src/server.ts";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * `--passphrase-file` (and LICENSING_KEYSTORE_PASSPHRASE_FILE) is read with a bound: a path that
 * names something other than a passphrase file (a device, a log) is refused with one line instead
 * of being read until memory runs out.
 */
const work = mkdtempSync(join(tmpdir(), "passphrase-file-cli-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

let made = 0;
const initWith = (file: string, env: Record<string, string> = {}) => {
  const dataDir = join(work, `data-${made++}`);
  const args = ["init", "--data-dir", dataDir, "--json"];
  return runInProcess(file === "" ? args : [...args, "--passphrase-file", file], work, env).then(
    (result) => ({ ...result, dataDir }),
  );
};

const writeSecret = (name: string, text: string) => {
  const file = join(work, name);
  writeFileSync(file, text, { mode: 0o600 });
  return file;
};

describe("the passphrase file's size", () => {
  test("a passphrase file one byte longer than 64 KiB is refused with one line and no keystore", async () => {
    const file = writeSecret("too-long", "p".repeat(MAX_SECRET_FILE_BYTES + 1));
    const result = await initWith(file);
    expect(result.code).toBe(1);
    expect(result.stdout).toBe("");
    expect(result.stderr).toBe(`licensing init: the passphrase file ${file} is larger than 64 KiB\n`);
    expect(existsSync(join(result.dataDir, "keystore.json"))).toBe(false);
  });

  test("the bound holds for the file named by LICENSING_KEYSTORE_PASSPHRASE_FILE too", async () => {
    const file = writeSecret("too-long-env", `${"p".repeat(MAX_SECRET_FILE_BYTES)}\n`);
    const result = await initWith("", { LICENSING_KEYSTORE_PASSPHRASE_FILE: file });
    expect(result.code).toBe(1);
    expect(result.stderr).toContain("is larger than 64 KiB");
  });

  test.skipIf(!existsSync("/dev/zero"))(
    "--passphrase-file /dev/zero is refused at once instead of filling memory",
    async () => {
      const result = await initWith("/dev/zero");
      expect(result.code).toBe(1);
      expect(result.stderr).toBe("licensing init: the passphrase file /dev/zero is larger than 64 KiB\n");
    },
    2_000,
  );

  test("a file of exactly 64 KiB is read whole, its trailing CRLF not part of the passphrase", async () => {
    const passphrase = "p".repeat(MAX_SECRET_FILE_BYTES - 2);
    const result = await initWith(writeSecret("at-the-bound", `${passphrase}\r\n`));
    expect(result.code).toBe(0);
    expect(() => openKeystore(result.dataDir, passphrase)).not.toThrow();
  });

  test("a missing file is still reported as unreadable", async () => {
    const file = join(work, "missing");
    const result = await initWith(file);
    expect(result.code).toBe(1);
    expect(result.stderr).toStartWith(`licensing init: cannot read the passphrase file ${file}: ENOENT`);
  });
});

describe("readBoundedFile", () => {
  test("it gives the whole file up to the bound and null past it", () => {
    const file = writeSecret("ten", "0123456789");
    expect(readBoundedFile(file, 10)?.toString()).toBe("0123456789");
    expect(readBoundedFile(file, 9)).toBeNull();
    expect(readBoundedFile(writeSecret("empty", ""), 10)?.length).toBe(0);
  });
});
