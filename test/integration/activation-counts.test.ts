import { Database } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { activatedDevice, proofCall, runtimeFixture } from "../support/runtime.ts";

/**
 * activation_counts is what activation asks first ("is there a free slot?"); triggers keep it,
 * so these tests compare it with a count of the activations themselves after every kind of move.
 */
const counted = (t: TestContext, licenseId: string) =>
  t.deps.sqlite
    .query<{ active: number }, [string]>("SELECT active FROM activation_counts WHERE license_id = ?")
    .get(licenseId)?.active ?? 0;
const actual = (t: TestContext, licenseId: string) =>
  t.deps.sqlite
    .query<{ n: number }, [string]>(
      "SELECT count(*) AS n FROM activations WHERE license_id = ? AND status = 'active'",
    )
    .get(licenseId)?.n ?? 0;

describe("the active-activation count", () => {
  let t: TestContext;
  beforeEach(() => {
    t = createTestContext();
  });
  afterEach(() => t.close());

  test("follows activation, re-activation, device and vendor deactivation", async () => {
    const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
    const devices = [];
    for (let i = 0; i < 3; i++) devices.push(await activatedDevice(t, fx));
    expect(counted(t, fx.licenseId)).toBe(3);
    const [first, second] = devices as [(typeof devices)[number], (typeof devices)[number]];
    const path = `/runtime/v1/activations/${first.activationId}`;
    expect((await proofCall(t, first.device, "DELETE", path, first.activationId)).status).toBe(200);
    expect((await t.call("DELETE", `/mgmt/v1/activations/${second.activationId}`)).status).toBeLessThan(300);
    expect(counted(t, fx.licenseId)).toBe(1);
    expect(counted(t, fx.licenseId)).toBe(actual(t, fx.licenseId));
  });

  test("a device culled when it comes back is counted down", async () => {
    const fx = await runtimeFixture(t, {
      policy: { max_machines: 1, heartbeat_required: true, heartbeat_sec: 3600, network_grace_sec: 3600 },
    });
    const stale = await activatedDevice(t, fx);
    t.clock.advance(3 * 3600);
    await activatedDevice(t, fx);
    // The stale device still counts as active until it learns it was displaced.
    expect(counted(t, fx.licenseId)).toBe(2);
    const path = `/runtime/v1/activations/${stale.activationId}/heartbeat`;
    const body = { machine_info_digest: stale.response.body.data.machine_info_digest };
    expect((await proofCall(t, stale.device, "POST", path, stale.activationId, body)).status).toBe(410);
    expect(counted(t, fx.licenseId)).toBe(1);
    expect(actual(t, fx.licenseId)).toBe(1);
  });

  test("a license full by count but holding stale devices admits new ones up to its limit of fresh ones", async () => {
    const fx = await runtimeFixture(t, {
      policy: { max_machines: 2, heartbeat_required: true, heartbeat_sec: 3600, network_grace_sec: 3600 },
    });
    await activatedDevice(t, fx);
    await activatedDevice(t, fx);
    t.clock.advance(3 * 3600);
    expect(counted(t, fx.licenseId)).toBe(2);
    await activatedDevice(t, fx);
    await activatedDevice(t, fx);
    expect(counted(t, fx.licenseId)).toBe(4);
    const refused = await activatedDevice(t, fx).catch((error: Error) => error);
    expect(refused).toBeInstanceOf(Error);
    expect((refused as Error).message).toContain("MACHINE_LIMIT_REACHED");
    expect(counted(t, fx.licenseId)).toBe(actual(t, fx.licenseId));
  });
});

test("the migration counts the activations a store already has, and deletes are counted down", () => {
  const dir = mkdtempSync(join(tmpdir(), "licensing-counts-"));
  try {
    const sqlite = new Database(join(dir, "licensing.db"), { create: true, strict: true });
    const migrations = embeddedMigrations();
    const at = migrations.findIndex((m) => m.tag.endsWith("_activation_counts"));
    expect(at).toBeGreaterThan(0);
    migrate(sqlite, migrations.slice(0, at));
    sqlite.run("PRAGMA foreign_keys = OFF");
    const insert = sqlite.prepare(
      `INSERT INTO activations (id, environment, product_id, license_id, status, device_signing_key,
       device_thumbprint, device_kem_key, machine_info, machine_info_digest, machine_baseline_at,
       machine_signals, activated_at, last_seen_at, certificate_expires_at)
       VALUES (?, 'live', 'prod_x', ?, ?, 'k', ?, 'kem', '{}', 'd', 0, '{}', 0, 0, 0)`,
    );
    insert.run("act_1", "lic_a", "active", "t1");
    insert.run("act_2", "lic_a", "active", "t2");
    insert.run("act_3", "lic_a", "deactivated", "t3");
    insert.run("act_4", "lic_b", "active", "t4");
    migrate(sqlite, migrations);
    const counts = () =>
      Object.fromEntries(
        sqlite
          .query<{ license_id: string; active: number }, []>(
            "SELECT license_id, active FROM activation_counts",
          )
          .all()
          .map((row) => [row.license_id, row.active]),
      );
    expect(counts()).toEqual({ lic_a: 2, lic_b: 1 });
    sqlite.run("DELETE FROM activations WHERE id = 'act_1'");
    sqlite.run("DELETE FROM activations WHERE id = 'act_3'");
    sqlite.run("UPDATE activations SET status = 'active' WHERE id = 'act_2'"); // no change of state
    expect(counts()).toEqual({ lic_a: 1, lic_b: 1 });
    sqlite.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
