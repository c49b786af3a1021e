import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { resolveConfig } from "../../src/config.ts";
import { jsonLogger } from "../../src/http/logger.ts";
import { startServer } from "../../src/server.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";
import {
  createFirstSchemaDataDir,
  expectUpgradedDataIntact,
  FIRST_SCHEMA_PASSPHRASE,
} from "../support/first-schema.ts";

/**
 * Upgrade from the first released schema, in-process: the server's own start-up (migrations,
 * sweeper) on a data dir that only migration 0000 ever touched. test/e2e/upgrade.test.ts does the
 * same with the executable.
 */
const dir = mkdtempSync(join(tmpdir(), "licensing-upgrade-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("a data dir of the first schema is migrated on start and every row reads back intact", async () => {
  const data = createFirstSchemaDataDir(join(dir, "data"));
  const lines: string[] = [];
  const config = { ...resolveConfig({ "data-dir": data.dataDir }, {}, dir), port: 0 };
  const server = startServer({
    config,
    passphrase: FIRST_SCHEMA_PASSPHRASE,
    logger: jsonLogger("info", (line) => lines.push(line) > 0),
  });
  try {
    const ready = lines.map((line) => JSON.parse(line)).find((line) => line.msg === "store ready");
    expect(ready.applied).toEqual(
      embeddedMigrations()
        .slice(1)
        .map((m) => m.tag),
    );
    await expectUpgradedDataIntact(server.url, data);
  } finally {
    await server.shutdown("test");
  }
});
