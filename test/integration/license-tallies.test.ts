import { Database } from "bun:sqlite";
import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * license_tallies is what the plan's quotas read (on every license create, and GET /mgmt/v1/plan);
 * triggers keep it, so these tests compare it with a count of the licenses themselves after every
 * kind of change.
 */
type Tally = Record<string, number>;

const tallied = (sqlite: Database): Tally =>
  Object.fromEntries(
    sqlite
      .query<{ environment: string; license_type: string; unrevoked: number }, []>(
        "SELECT environment, license_type, unrevoked FROM license_tallies WHERE unrevoked <> 0",
      )
      .all()
      .map((row) => [`${row.environment}/${row.license_type}`, row.unrevoked]),
  );
const counted = (sqlite: Database): Tally =>
  Object.fromEntries(
    sqlite
      .query<{ environment: string; license_type: string; n: number }, []>(
        `SELECT environment, license_type, count(*) AS n FROM licenses WHERE status <> 'revoked'
         GROUP BY environment, license_type`,
      )
      .all()
      .map((row) => [`${row.environment}/${row.license_type}`, row.n]),
  );

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

test("the tally follows create, suspension, reinstatement, revocation and trial conversion, in both environments", async () => {
  const f = factories(t);
  const live = f.product({ environment: "live" });
  const testProduct = f.product({ environment: "test" });
  const perpetual = f.policy({ productId: live.id, environment: "live" });
  const trial = f.policy({ productId: live.id, environment: "live", licenseType: "trial", trialDays: 14 });
  const yearly = f.policy({
    productId: live.id,
    environment: "live",
    licenseType: "subscription",
    billingCycle: "yearly",
  });
  const testPolicy = f.policy({ productId: testProduct.id, environment: "test" });
  const create = async (productId: string, policyId: string, key = t.keys.live) => {
    const response = await t.call("POST", "/mgmt/v1/licenses", {
      key,
      body: { product_id: productId, policy_id: policyId },
      headers: t.idem(),
    });
    expect(response.status).toBe(201);
    return response.body.data.public_id as string;
  };
  const steps: Tally[] = [];
  const check = () => {
    expect(tallied(t.deps.sqlite)).toEqual(counted(t.deps.sqlite));
    steps.push(tallied(t.deps.sqlite));
  };

  const first = await create(live.id, perpetual.id);
  const second = await create(live.id, perpetual.id);
  const trialLicense = await create(live.id, trial.id);
  await create(testProduct.id, testPolicy.id, t.keys.test);
  check();
  await t.call("PATCH", `/mgmt/v1/licenses/${first}`, { body: { status_action: "suspended" } });
  check();
  await t.call("PATCH", `/mgmt/v1/licenses/${first}`, { body: { status_action: "active" } });
  check();
  expect((await t.call("DELETE", `/mgmt/v1/licenses/${second}`)).status).toBe(204);
  check();
  // Revoking again changes nothing.
  expect((await t.call("DELETE", `/mgmt/v1/licenses/${second}`)).status).toBe(204);
  check();
  const converted = await t.call("POST", `/mgmt/v1/licenses/${trialLicense}/convert-trial`, {
    body: { target_policy_id: yearly.id },
    headers: t.idem(),
  });
  expect(converted.status).toBe(200);
  check();
  // The steps themselves, so a tally that never moved could not pass.
  const [created, suspended, reinstated, revoked, revokedAgain, afterConversion] = steps;
  expect(created).toEqual({ "live/perpetual": 2, "live/trial": 1, "test/perpetual": 1 });
  expect(suspended).toEqual(created);
  expect(reinstated).toEqual(created);
  expect(revoked).toEqual({ "live/perpetual": 1, "live/trial": 1, "test/perpetual": 1 });
  expect(revokedAgain).toEqual(revoked);
  expect(afterConversion).toEqual({ "live/perpetual": 1, "live/subscription": 1, "test/perpetual": 1 });
  const quotas = (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas;
  expect([quotas.licenses?.used, quotas.trial_licenses?.used ?? 0]).toEqual([2, 0]);
});

test("the migration tallies the licenses a store already has; deletes and raw updates keep it", () => {
  const dir = mkdtempSync(join(tmpdir(), "licensing-tallies-"));
  try {
    const sqlite = new Database(join(dir, "licensing.db"), { create: true, strict: true });
    const migrations = embeddedMigrations();
    const at = migrations.findIndex((m) => m.tag.endsWith("_license_tallies"));
    expect(at).toBeGreaterThan(0);
    migrate(sqlite, migrations.slice(0, at));
    sqlite.run("PRAGMA foreign_keys = OFF");
    const insert = sqlite.prepare(
      `INSERT INTO licenses (id, environment, product_id, policy_id, key_ciphertext, key_lookup,
       license_type, status, renewal_authority, entitlements, metadata, created_at, updated_at)
       VALUES (?, ?, 'prod_x', 'pol_x', 'c', ?, ?, ?, 'vendor', '{}', '{}', 0, 0)`,
    );
    insert.run("lic_1", "live", "k1", "perpetual", "active");
    insert.run("lic_2", "live", "k2", "perpetual", "suspended");
    insert.run("lic_3", "live", "k3", "perpetual", "revoked");
    insert.run("lic_4", "live", "k4", "trial", "active");
    insert.run("lic_5", "test", "k5", "trial", "active");
    migrate(sqlite, migrations);
    expect(tallied(sqlite)).toEqual({ "live/perpetual": 2, "live/trial": 1, "test/trial": 1 });
    sqlite.run("DELETE FROM licenses WHERE id IN ('lic_1', 'lic_3')");
    sqlite.run("UPDATE licenses SET license_type = 'subscription' WHERE id = 'lic_4'");
    sqlite.run("UPDATE licenses SET status = 'revoked' WHERE id = 'lic_5'");
    sqlite.run("UPDATE licenses SET status = 'active' WHERE id = 'lic_2'"); // still counted once
    expect(tallied(sqlite)).toEqual({ "live/perpetual": 1, "live/subscription": 1 });
    expect(tallied(sqlite)).toEqual(counted(sqlite));
    sqlite.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
