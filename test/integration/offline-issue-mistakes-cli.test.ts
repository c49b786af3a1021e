import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { runInProcess } from "../support/in-process-cli.ts";
import { integrationConfig, MACHINE, sdkClient } from "../support/offline.ts";
import { runtimeFixture } from "../support/runtime.ts";

/**
 * `licensing offline issue` given the wrong thing: a license key where its id belongs, or no data
 * directory. A well-formed request file (made by a device of another store) gets the command past
 * its own checks to the ones under test.
 */
let t: TestContext;
let licenseKey: string;
let cwd: string;

beforeAll(async () => {
  t = createTestContext();
  const fx = await runtimeFixture(t, { policy: { validation_mode: "hybrid" } });
  licenseKey = fx.licenseKey;
  const request = await sdkClient(t, await integrationConfig(t, fx.productId)).createOfflineRequest({
    machineInfo: MACHINE,
  });
  // Outside the data directory, where no package may be written.
  cwd = mkdtempSync(join(tmpdir(), "offline-issue-mistakes-"));
  writeFileSync(join(cwd, "request.json"), JSON.stringify(request));
});
afterAll(() => {
  t?.close();
  rmSync(cwd, { recursive: true, force: true });
});

const issue = (license: string, env: Record<string, string> = {}) =>
  runInProcess(
    ["offline", "issue", "--license", license, "--request", "request.json", "--out", "p.zip"],
    cwd,
    env,
  );

describe("licensing offline issue", () => {
  test("a license key given as --license is refused as a usage error without echoing it, in any spelling", async () => {
    const spellings = [
      licenseKey,
      licenseKey.toLowerCase(),
      licenseKey.replaceAll("-", ""),
      ` ${licenseKey} `,
    ];
    for (const given of spellings) {
      const result = await issue(given, { LICENSING_DATA_DIR: t.dir });
      expect(result).toEqual({
        code: 2,
        stdout: "",
        stderr:
          "licensing offline issue: --license: that looks like a license key; give the license's id (lic_…)\n" +
          'Run "licensing offline issue --help" for its options.\n',
      });
      for (const group of licenseKey.split("-")) expect(result.stderr.toUpperCase()).not.toContain(group);
    }
    expect(existsSync(join(cwd, "p.zip"))).toBe(false);
  });

  test("an id that is no license is still named, as it is no secret", async () => {
    const result = await issue("lic_01JZ8X4M6Q2T9V3B7N5K1R0W8Y", {
      LICENSING_DATA_DIR: t.dir,
      LICENSING_KEYSTORE_PASSPHRASE: "test passphrase",
    });
    expect([result.code, result.stderr]).toEqual([
      1,
      "licensing offline issue: no license lic_01JZ8X4M6Q2T9V3B7N5K1R0W8Y\n",
    ]);
  });

  test("run without --data-dir where there is no ./data, it names the missing directory, not the passphrase", async () => {
    for (const env of [{}, { LICENSING_KEYSTORE_PASSPHRASE: "a long enough passphrase" }] as Record<
      string,
      string
    >[]) {
      const result = await issue("lic_01JZ8X4M6Q2T9V3B7N5K1R0W8Y", env);
      expect([result.code, result.stdout]).toEqual([1, ""]);
      expect(result.stderr).toBe(
        `licensing offline issue: no data directory at ${join(cwd, "data")} (nothing initialised there): ` +
          'pass --data-dir or LICENSING_DATA_DIR with the server\'s data directory, or run "licensing init" to make a new one\n',
      );
    }
    expect(readdirSync(cwd)).toEqual(["request.json"]);
  });
});
