import { Database } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { activatedDevice, proofCall, type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";

/**
 * lease_counts is what a lease acquire asks first ("fewer leases marked active than seats?");
 * triggers keep it, so these tests compare it with the leases themselves after every kind of move.
 */
const counted = (t: TestContext, licenseId: string) =>
  t.deps.sqlite
    .query<{ active: number }, [string]>("SELECT active FROM lease_counts WHERE license_id = ?")
    .get(licenseId)?.active ?? 0;
const actual = (t: TestContext, licenseId: string) =>
  t.deps.sqlite
    .query<{ n: number }, [string]>(
      "SELECT count(*) AS n FROM leases WHERE license_id = ? AND status = 'active'",
    )
    .get(licenseId)?.n ?? 0;

describe("the active-lease count", () => {
  let t: TestContext;
  let fx: RuntimeFixture;
  type Device = Awaited<ReturnType<typeof activatedDevice>>;
  const acquire = (d: Device, instance: string) =>
    proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, {
      activation_id: d.activationId,
      instance_id: instance,
    });
  beforeEach(async () => {
    t = createTestContext();
    fx = await runtimeFixture(t, {
      policy: { max_machines: 10, max_concurrent: 2, concurrency_unit: "instance", lease_ttl_sec: 600 },
    });
  });
  afterEach(() => t.close());

  test("follows acquire, re-acquire, release and the end of the device's activation", async () => {
    const d = await activatedDevice(t, fx);
    const a = await acquire(d, "instance-a");
    expect(a.status).toBe(201);
    expect((await acquire(d, "instance-a")).status).toBe(201); // the same seat, extended
    expect((await acquire(d, "instance-b")).status).toBe(201);
    expect(counted(t, fx.licenseId)).toBe(2);
    const released = await proofCall(
      t,
      d.device,
      "DELETE",
      `/runtime/v1/leases/${a.body.data.lease_id}`,
      d.activationId,
      {
        instance_id: "instance-a",
      },
    );
    expect(released.status).toBe(200);
    expect(counted(t, fx.licenseId)).toBe(1);
    const path = `/runtime/v1/activations/${d.activationId}`;
    expect((await proofCall(t, d.device, "DELETE", path, d.activationId)).status).toBe(200);
    expect(counted(t, fx.licenseId)).toBe(0);
    expect(counted(t, fx.licenseId)).toBe(actual(t, fx.licenseId));
  });

  test("a license whose count is at its limit still seats a device when the marked leases have expired", async () => {
    const d = await activatedDevice(t, fx);
    expect((await acquire(d, "instance-a")).status).toBe(201);
    expect((await acquire(d, "instance-b")).status).toBe(201);
    const full = await acquire(d, "instance-c");
    expect(full.status).toBe(409);
    expect(full.body.error.code).toBe("CONCURRENCY_LIMIT_REACHED");
    t.clock.advance(601);
    // Both leases are still marked active (nobody released them), but neither is live.
    expect(counted(t, fx.licenseId)).toBe(2);
    expect((await acquire(d, "instance-c")).status).toBe(201);
    expect((await acquire(d, "instance-d")).status).toBe(201);
    expect((await acquire(d, "instance-e")).status).toBe(409);
    expect(counted(t, fx.licenseId)).toBe(actual(t, fx.licenseId));
  });
});

test("the migration counts the leases a store already has, and deletes are counted down", () => {
  const dir = mkdtempSync(join(tmpdir(), "licensing-lease-counts-"));
  try {
    const sqlite = new Database(join(dir, "licensing.db"), { create: true, strict: true });
    const migrations = embeddedMigrations();
    const at = migrations.findIndex((m) => m.tag.endsWith("_lease_counts"));
    expect(at).toBeGreaterThan(0);
    migrate(sqlite, migrations.slice(0, at));
    sqlite.run("PRAGMA foreign_keys = OFF");
    const insert = sqlite.prepare(
      `INSERT INTO leases (id, license_id, activation_id, instance_id, status, created_at, expires_at)
       VALUES (?, ?, 'act_x', ?, ?, 0, 0)`,
    );
    insert.run("lea_1", "lic_a", "i1", "active");
    insert.run("lea_2", "lic_a", "i2", "active");
    insert.run("lea_3", "lic_a", "i3", "released");
    insert.run("lea_4", "lic_b", "i4", "active");
    migrate(sqlite, migrations);
    const counts = () =>
      Object.fromEntries(
        sqlite
          .query<{ license_id: string; active: number }, []>("SELECT license_id, active FROM lease_counts")
          .all()
          .map((row) => [row.license_id, row.active]),
      );
    expect(counts()).toEqual({ lic_a: 2, lic_b: 1 });
    sqlite.run("DELETE FROM leases WHERE id = 'lea_1'");
    sqlite.run("DELETE FROM leases WHERE id = 'lea_3'");
    sqlite.run("UPDATE leases SET status = 'released' WHERE id = 'lea_4'");
    expect(counts()).toEqual({ lic_a: 1, lic_b: 0 });
    sqlite.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
