import { Database } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { DeviceBlockService } from "../../src/modules/device-blocks/service.ts";
import { DISTINCT_ENTRIES_PER_HOUR } from "../../src/modules/runtime-events/service.ts";
import { createServices } from "../../src/services.ts";
import { TestDevice } from "../support/device.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";
import {
  activate,
  activatedDevice,
  heartbeatPath,
  proofCall,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";

let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t, {
    policy: { license_type: "subscription", max_machines: 5, heartbeat_sec: 3600, max_concurrent: 5 },
  });
});
afterEach(() => t.close());

const DIGEST = machineInfoDigest({ os: "linux", arch: "x64" });
const auditCount = () =>
  (t.deps.sqlite.query("SELECT count(*) AS n FROM audit_events").get() as { n: number }).n;

describe("activations", () => {
  test("a license lists its devices, newest first, with machine and key thumbprint", async () => {
    const a = await activatedDevice(t, fx);
    const b = await activatedDevice(t, fx, "p256");
    const response = await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}/activations`);
    expect(response.status).toBe(200);
    expect(response.body.data.map((x: { id: string }) => x.id)).toEqual([b.activationId, a.activationId]);
    expect(response.body.data[1]).toMatchObject({
      license_id: fx.licenseId,
      status: "active",
      device_signing_key_thumbprint: a.device.thumbprint,
      machine: {
        info: { os: "linux", arch: "x64" },
        info_digest: DIGEST,
        signals: { hostname: "test-host" },
      },
    });
  });

  test("a page of a license's devices is read from an index in its order, never by sorting all of the license's rows", async () => {
    const a = await activatedDevice(t, fx);
    const b = await activatedDevice(t, fx);
    const c = await activatedDevice(t, fx);
    const { result: pages, sql } = await sqlPreparedDuring(t.deps.sqlite, async () => {
      const first = await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}/activations?limit=2`);
      const second = await t.call(
        "GET",
        `/mgmt/v1/licenses/${fx.licenseId}/activations?limit=2&cursor=${first.body.pagination.next_cursor}`,
      );
      return [first, second].map((page) => page.body.data.map((x: { id: string }) => x.id));
    });
    expect(pages).toEqual([[c.activationId, b.activationId], [a.activationId]]);
    // Sorting is what a license with 100k devices cannot afford: every page would sort them all
    // (~140 ms) on the thread that answers heartbeats.
    const listings = sql.filter((text) => /from "activations"/i.test(text) && /order by/i.test(text));
    expect(listings).toHaveLength(2);
    for (const listing of listings) {
      const plan = queryPlan(t.deps.sqlite, listing);
      expect(plan).toMatch(/^SEARCH activations USING INDEX \w+ \(license_id=\?/);
      expect(plan).not.toContain("TEMP B-TREE");
    }
  });

  test("counting a full license's devices reads its active ones only, not every device it ever had", async () => {
    // The count is prepared when the services are made: watch a second context being made.
    const { result: other, sql } = await sqlPreparedDuring(Database.prototype, () => createTestContext());
    try {
      const count = sql.find((text) => /count\(\*\) AS n FROM activations WHERE license_id/.test(text));
      expect(count).toBeDefined();
      expect(queryPlan(other.deps.sqlite, count as string)).toMatch(
        /^SEARCH activations USING INDEX \w+ \(license_id=\? AND status=\?\)/,
      );
    } finally {
      other.close();
    }
  });

  test("one activation shows its check-in state, and turns overdue when the device stays silent", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
      machine_info_digest: DIGEST,
      app_version: "3.2.1",
    });
    const fresh = (await t.call("GET", `/mgmt/v1/activations/${activationId}`)).body.data;
    const beatAt = new Date(fresh.last_heartbeat_at).getTime();
    expect(fresh).toMatchObject({
      heartbeat_interval_sec: 3600,
      heartbeat_overdue: false,
      app_version: "3.2.1",
      sdk_version: "test",
    });
    expect(new Date(fresh.next_heartbeat_due.earliest).getTime()).toBe(beatAt + 3240_000);
    expect(new Date(fresh.next_heartbeat_due.latest).getTime()).toBe(beatAt + 3960_000);
    expect(new Date(fresh.certificate_expires_at).getTime()).toBeGreaterThan(beatAt);
    t.clock.advance(3961);
    expect((await t.call("GET", `/mgmt/v1/activations/${activationId}`)).body.data.heartbeat_overdue).toBe(
      true,
    );
  });

  test("a forced deactivation frees the slot and the seats, is audited, and the device hears 410", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    await proofCall(t, device, "POST", "/runtime/v1/leases", activationId, {
      activation_id: activationId,
      instance_id: "i",
    });
    expect((await t.call("DELETE", `/mgmt/v1/activations/${activationId}`)).status).toBe(204);
    expect((await t.call("DELETE", `/mgmt/v1/activations/${activationId}`)).status).toBe(204);
    const leases = t.deps.sqlite.query("SELECT count(*) AS n FROM leases WHERE status = 'active'").get();
    expect(leases).toEqual({ n: 0 });
    const beat = await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
      machine_info_digest: DIGEST,
    });
    expect(beat.status).toBe(410);
    const events = (await t.call("GET", "/mgmt/v1/events")).body.data;
    expect(events[0]).toMatchObject({ type: "activation.deactivated", target: { id: activationId } });
    expect((await t.call("GET", `/mgmt/v1/activations/${activationId}`)).body.data.deactivation_reason).toBe(
      "vendor",
    );
  });
});

describe("runtime events", () => {
  const failBeat = (device: TestDevice, id: string) =>
    proofCall(
      t,
      device,
      "POST",
      heartbeatPath(id),
      id,
      { machine_info_digest: DIGEST },
      { timestamp: Math.floor(t.clock.now().getTime() / 1000) - 1000 },
    );

  test("rejections are counted on one entry per target, operation and code per hour, oldest first", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    await failBeat(device, activationId);
    await failBeat(device, activationId);
    await activate(t, new TestDevice(), { ...fx, licenseKey: "ZZZZZ-ZZZZZ-ZZZZZ-ZZZZZ-ZZZZZ" });
    t.clock.advance(3600);
    const last = await failBeat(device, activationId);
    const entries = (await t.call("GET", "/mgmt/v1/runtime_events")).body.data;
    expect(entries).toHaveLength(3);
    expect(entries[0]).toMatchObject({
      operation: "heartbeat",
      outcome: "rejected",
      code: "CLOCK_SKEW",
      http_status: 401,
      occurrences: 2,
      activation_id: activationId,
      license_id: fx.licenseId,
      product_id: fx.productId,
      details_omitted: false,
    });
    expect(entries[1]).toMatchObject({
      operation: "activation_create",
      code: "LICENSE_KEY_INVALID",
      license_id: null,
      occurrences: 1,
    });
    expect(entries[2]).toMatchObject({
      code: "CLOCK_SKEW",
      occurrences: 1,
      last_request_id: last.headers.get("x-request-id"),
    });
  });

  test("successes, requests naming no known product or activation, and old entries are left out", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
      machine_info_digest: DIGEST,
    });
    await activate(t, new TestDevice(), { ...fx, productId: "prod_01M81Z00000000000000000000" });
    await failBeat(new TestDevice(), "act_01M81Z00000000000000000000");
    expect((await t.call("GET", "/mgmt/v1/runtime_events")).body.data).toHaveLength(0);
    await failBeat(device, activationId);
    t.clock.advance(7 * 86_400 + 1);
    expect((await t.call("GET", "/mgmt/v1/runtime_events")).body.data).toHaveLength(0);
  });

  test("filters narrow the list, and a filter naming something unknown answers 404", async () => {
    const a = await activatedDevice(t, fx);
    const b = await activatedDevice(t, fx);
    await failBeat(a.device, a.activationId);
    await failBeat(b.device, b.activationId);
    const onlyA = await t.call("GET", `/mgmt/v1/runtime_events?activation_id=${a.activationId}`);
    expect(onlyA.body.data.map((e: { activation_id: string }) => e.activation_id)).toEqual([a.activationId]);
    expect(
      (await t.call("GET", `/mgmt/v1/runtime_events?license_id=${fx.licenseId}`)).body.data,
    ).toHaveLength(2);
    const future = new Date(t.clock.now().getTime() + 60_000).toISOString();
    expect((await t.call("GET", `/mgmt/v1/runtime_events?since=${future}`)).body.data).toHaveLength(0);
    expect(
      (await t.call("GET", "/mgmt/v1/runtime_events?license_id=lic_01M81Z00000000000000000000")).status,
    ).toBe(404);
    expect((await t.call("GET", "/mgmt/v1/runtime_events?since=yesterday")).status).toBe(400);
    expect((await t.call("GET", "/mgmt/v1/runtime_events", { key: t.keys.test })).body.data).toHaveLength(0);
  });

  test("since is a strict RFC 3339 date-time: no impossible dates, no bare years, lower-case t and z allowed", async () => {
    const fx = await runtimeFixture(t);
    const a = await activatedDevice(t, fx);
    await failBeat(a.device, a.activationId);
    const past = new Date(t.clock.now().getTime() - 60_000).toISOString();
    const since = (value: string) => t.call("GET", `/mgmt/v1/runtime_events?since=${value}`);
    expect((await since(past)).body.data).toHaveLength(1);
    expect((await since(past.toLowerCase())).body.data).toHaveLength(1);
    for (const value of ["2030", "2030-02-31T00:00:00Z", "2030-01-01", "Jan%201%202030"]) {
      const refused = await since(value);
      expect([value, refused.status, refused.body.error.code]).toEqual([value, 400, "INVALID_REQUEST"]);
    }
  });

  test("pages through entries oldest first", async () => {
    const devices = await Promise.all([0, 1, 2].map(() => activatedDevice(t, fx)));
    for (const d of devices) await failBeat(d.device, d.activationId);
    const first = await t.call("GET", "/mgmt/v1/runtime_events?limit=2");
    expect(first.body.pagination.has_more).toBe(true);
    const second = await t.call(
      "GET",
      `/mgmt/v1/runtime_events?limit=2&cursor=${first.body.pagination.next_cursor}`,
    );
    const order = [...first.body.data, ...second.body.data].map(
      (e: { activation_id: string }) => e.activation_id,
    );
    expect(order).toEqual(devices.map((d) => d.activationId));
  });

  test("past the hourly cap of distinct entries, the rest are counted on an entry without targets", async () => {
    const events = createServices(t.deps, { baseUrl: BASE_URL }).runtimeEvents;
    for (let i = 0; i <= DISTINCT_ENTRIES_PER_HOUR + 2; i++) {
      events.record({
        environment: "live",
        operation: "heartbeat",
        code: "DEVICE_PROOF_INVALID",
        httpStatus: 401,
        productId: fx.productId,
        licenseId: fx.licenseId,
        activationId: `act_${String(i).padStart(26, "0")}`,
        requestId: `req_${i}`,
      });
    }
    const entries = await everyRuntimeEvent(t.keys.live);
    const omitted = entries.filter((e: { details_omitted: boolean }) => e.details_omitted);
    expect(entries.length - omitted.length).toBe(DISTINCT_ENTRIES_PER_HOUR);
    expect(omitted).toEqual([
      expect.objectContaining({ occurrences: 3, activation_id: null, license_id: null, product_id: null }),
    ]);
  });

  test("a flood of test-environment refusals does not push live refusals into the overflow entry", async () => {
    const events = createServices(t.deps, { baseUrl: BASE_URL }).runtimeEvents;
    const refusal = (environment: "live" | "test", i: number) => ({
      environment,
      operation: "heartbeat" as const,
      code: "DEVICE_PROOF_INVALID" as const,
      httpStatus: 401,
      productId: fx.productId,
      licenseId: fx.licenseId,
      activationId: `act_${String(i).padStart(26, "0")}`,
      requestId: `req_${environment}_${i}`,
    });
    for (let i = 0; i < DISTINCT_ENTRIES_PER_HOUR + 5; i++) events.record(refusal("test", i));
    events.record(refusal("live", 1));

    const live = (await t.call("GET", "/mgmt/v1/runtime_events")).body.data;
    expect(live).toEqual([
      expect.objectContaining({
        details_omitted: false,
        activation_id: `act_${String(1).padStart(26, "0")}`,
      }),
    ]);
    const testEntries = await everyRuntimeEvent(t.keys.test);
    expect(testEntries.filter((e) => e.details_omitted)).toEqual([
      expect.objectContaining({ occurrences: 5 }),
    ]);
  });
});

/** Every runtime event the key's environment lists, page by page. */
async function everyRuntimeEvent(key: string): Promise<{ details_omitted: boolean }[]> {
  let entries: { details_omitted: boolean }[] = [];
  let cursor: string | null = null;
  do {
    const query: string = cursor ? `limit=200&cursor=${cursor}` : "limit=200";
    const page = (await t.call("GET", `/mgmt/v1/runtime_events?${query}`, { key })).body;
    entries = [...entries, ...page.data];
    cursor = page.pagination.next_cursor;
  } while (cursor);
  return entries;
}

describe("device blocks", () => {
  test("a block is listed, refuses the device at once, and lifting it lets the device back", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const created = await t.call("POST", "/mgmt/v1/device-blocks", {
      body: {
        kind: "device_key",
        device_signing_key_thumbprint: device.thumbprint,
        reason: "chargeback fraud",
      },
    });
    expect(created.status).toBe(201);
    expect(created.body.data).toMatchObject({
      kind: "device_key",
      device_signing_key_thumbprint: device.thumbprint,
      license_id: null,
    });
    const again = await t.call("POST", "/mgmt/v1/device-blocks", {
      body: { kind: "device_key", device_signing_key_thumbprint: device.thumbprint },
    });
    expect(again.body.data.id).toBe(created.body.data.id);
    expect((await t.call("GET", "/mgmt/v1/device-blocks")).body.data).toHaveLength(1);
    const refused = await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
      machine_info_digest: DIGEST,
    });
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("DEVICE_BLOCKED");
    expect((await t.call("DELETE", `/mgmt/v1/device-blocks/${created.body.data.id}`)).status).toBe(204);
    const back = await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
      machine_info_digest: DIGEST,
    });
    expect(back.status).toBe(200);
  });

  test("a block needs the target its kind names", async () => {
    const missing = await t.call("POST", "/mgmt/v1/device-blocks", { body: { kind: "license" } });
    expect(missing.status).toBe(422);
    expect(missing.body.error.details.errors.license_id).toBeDefined();
    const unknown = await t.call("POST", "/mgmt/v1/device-blocks", {
      body: { kind: "license", license_id: "lic_01M81Z00000000000000000000" },
    });
    expect(unknown.status).toBe(422);
  });

  test("a runtime call finds the blocks in force with point lookups, not a walk through the environment's blocks", async () => {
    const { sql } = await sqlPreparedDuring(t.deps.sqlite, () => new DeviceBlockService(t.deps));
    const lookups = sql.filter((text) => /from device_blocks/i.test(text));
    expect(lookups).toHaveLength(2);
    for (const lookup of lookups) {
      const plan = queryPlan(t.deps.sqlite, lookup);
      expect(plan).toContain("USING INDEX device_blocks_target (environment=? AND kind=? AND target=?)");
      expect(plan).not.toMatch(/\(environment=\?\)|SCAN/);
    }
  });

  test("a field that does not apply to the kind answers 422 keyed by that field, and nothing is blocked", async () => {
    const events = auditCount();
    const license = await t.call("POST", "/mgmt/v1/device-blocks", {
      body: { kind: "license", license_id: fx.licenseId, device_signing_key_thumbprint: "a".repeat(64) },
    });
    expect(license.status).toBe(422);
    expect(Object.keys(license.body.error.details.errors)).toEqual(["device_signing_key_thumbprint"]);
    const device = await t.call("POST", "/mgmt/v1/device-blocks", {
      body: { kind: "device_key", device_signing_key_thumbprint: "a".repeat(64), license_id: fx.licenseId },
    });
    expect(device.status).toBe(422);
    expect(Object.keys(device.body.error.details.errors)).toEqual(["license_id"]);
    expect((await t.call("GET", "/mgmt/v1/device-blocks")).body.data).toEqual([]);
    expect(auditCount()).toBe(events);
  });

  test("lifting a block twice answers 204 both times and records one removal; an unknown id is 404", async () => {
    const created = await t.call("POST", "/mgmt/v1/device-blocks", {
      body: { kind: "license", license_id: fx.licenseId },
    });
    const path = `/mgmt/v1/device-blocks/${created.body.data.id}`;
    expect((await t.call("DELETE", path)).status).toBe(204);
    const events = auditCount();
    expect((await t.call("DELETE", path)).status).toBe(204);
    expect(auditCount()).toBe(events);
    expect((await t.call("GET", "/mgmt/v1/device-blocks")).body.data).toEqual([]);
    expect((await t.call("DELETE", path, { key: t.keys.test })).status).toBe(404);
    expect((await t.call("DELETE", "/mgmt/v1/device-blocks/blk_01M81Z00000000000000000000")).status).toBe(
      404,
    );
    // The target can be blocked again: a new block, in force, lifted on its own.
    const again = await t.call("POST", "/mgmt/v1/device-blocks", {
      body: { kind: "license", license_id: fx.licenseId },
    });
    expect(again.status).toBe(201);
    expect(again.body.data.id).not.toBe(created.body.data.id);
    expect(
      (await t.call("GET", "/mgmt/v1/device-blocks")).body.data.map((b: { id: string }) => b.id),
    ).toEqual([again.body.data.id]);
    const types = t.deps.sqlite
      .query<{ type: string }, []>(
        "SELECT type FROM audit_events WHERE target_type = 'device_block' ORDER BY id",
      )
      .all()
      .map((row) => row.type);
    expect(types).toEqual(["device_block.created", "device_block.removed", "device_block.created"]);
  });
});

describe("usage report", () => {
  test("counts new activations, active machines and active leases of the period", async () => {
    const a = await activatedDevice(t, fx);
    await activatedDevice(t, fx);
    await proofCall(t, a.device, "POST", "/runtime/v1/leases", a.activationId, {
      activation_id: a.activationId,
      instance_id: "i",
    });
    await t.call("DELETE", `/mgmt/v1/activations/${a.activationId}`);
    const report = (await t.call("GET", "/mgmt/v1/reports/usage")).body.data;
    expect(report).toMatchObject({
      new_activations: 2,
      active_machines: 1,
      active_leases: 0,
      active_licenses: 1,
    });
  });
});
