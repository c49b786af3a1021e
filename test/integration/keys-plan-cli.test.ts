import { Database } from "bun:sqlite";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { finishInit, initialise } from "../../src/cli/init.ts";
import { resolveConfig } from "../../src/config.ts";
import { runInProcess } from "../support/in-process-cli.ts";
import { storeDigest } from "../support/store-digest.ts";

/**
 * `licensing keys` and `licensing plan set` run through the real command-line entry point on a
 * data dir whose store refuses audit records (a trigger that raises, as a full disk or a broken
 * store would): every change stands only with its audit record.
 */
const work = mkdtempSync(join(tmpdir(), "keys-plan-cli-"));
const dataDir = join(work, "data");
let store: Database;
let liveKeyId: string;

const cli = (args: string[]) => runInProcess([...args, "--data-dir", dataDir], work);

/** A real store failure: SQLite refuses every audit record. */
const refuseAuditRecords = () =>
  store.run(
    `CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_events
     BEGIN SELECT RAISE(ABORT, 'simulated store failure'); END`,
  );

beforeAll(async () => {
  // As `licensing init` does once the keys are shown: the staging folder and the lock go.
  finishInit(initialise(resolveConfig({ "data-dir": dataDir }, {}, work)));
  store = new Database(join(dataDir, "licensing.db"));
  const keys = JSON.parse((await cli(["keys", "list", "--json"])).stdout) as {
    id: string;
    environment: string;
  }[];
  liveKeyId = keys.find((key) => key.environment === "live")?.id as string;
});
afterEach(() => store.run("DROP TRIGGER IF EXISTS refuse_audit"));
afterAll(() => {
  store.close();
  rmSync(work, { recursive: true, force: true });
});

describe("a change whose audit record cannot be written", () => {
  test("keys create fails, prints no key and stores none", async () => {
    refuseAuditRecords();
    const before = storeDigest(store);
    const run = await cli(["keys", "create", "--env", "live", "--scopes", "all"]);
    expect([run.code, run.stdout, run.stderr]).toEqual([
      1,
      "",
      expect.stringContaining("simulated store failure"),
    ]);
    expect(storeDigest(store)).toBe(before);
  });

  test("keys revoke fails and the key keeps working", async () => {
    refuseAuditRecords();
    const before = storeDigest(store);
    const run = await cli(["keys", "revoke", liveKeyId]);
    expect([run.code, run.stdout, run.stderr]).toEqual([
      1,
      "",
      expect.stringContaining("simulated store failure"),
    ]);
    expect(storeDigest(store)).toBe(before);
  });

  test("plan set fails and the plan stays as it was", async () => {
    refuseAuditRecords();
    const before = storeDigest(store);
    const run = await cli(["plan", "set", "free"]);
    expect([run.code, run.stdout, run.stderr]).toEqual([
      1,
      "",
      expect.stringContaining("simulated store failure"),
    ]);
    expect(storeDigest(store)).toBe(before);
  });

  test("without the failure, the same commands make their changes and audit them", async () => {
    const created = await cli(["keys", "create", "--env", "live", "--scopes", "all", "--json"]);
    expect(created.code).toBe(0);
    const { id } = JSON.parse(created.stdout) as { id: string };
    expect((await cli(["keys", "revoke", id])).code).toBe(0);
    expect((await cli(["plan", "set", "free"])).code).toBe(0);
    const events = store
      .query<{ type: string }, []>("SELECT type FROM audit_events ORDER BY id")
      .all()
      .map((row) => row.type);
    expect(events).toEqual([
      "api_key.created",
      "api_key.revoked",
      "workspace.plan_changed",
      "workspace.plan_changed",
    ]);
  });
});
