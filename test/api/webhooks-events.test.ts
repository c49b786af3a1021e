import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { IdGenerator } from "../../src/domain/ids.ts";
import { recordAudit } from "../../src/modules/events/service.ts";
import { announceExpiries } from "../../src/modules/webhooks/expiries.ts";
import { purgeFinishedDeliveries } from "../../src/modules/webhooks/retention.ts";
import { WebhookService } from "../../src/modules/webhooks/service.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { integrationConfig, MACHINE, requestPackage, sdkClient } from "../support/offline.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";
import { activate, activatedDevice, proofCall, runtimeFixture } from "../support/runtime.ts";

/**
 * What gets queued for webhooks, and when: audit events in the change's own transaction, the
 * runtime-side events (activation created and deactivated, lease and license expiry), nothing
 * for a change that rolled back, and nothing at all while no endpoint listens.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const cli = { actor: { type: "cli" as const, id: "test" }, environment: "live" as const, requestId: null };

function subscribe(events: string[]) {
  return new WebhookService(t.deps, { allowPrivateNetworks: false }).create(
    { url: "https://receiver.example.com/hook", events },
    cli,
  ).row;
}

interface Queued {
  type: string;
  environment: string;
  payload: {
    type: string;
    environment: string;
    data: {
      id: string;
      actor: { type: string };
      target: { type: string; id: string };
      data: Record<string, unknown>;
    };
  };
}

function queued(): Queued[] {
  return t.deps.sqlite
    .query<{ type: string; environment: string; payload: string }, []>(
      "SELECT e.type, e.environment, e.payload FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id ORDER BY d.id",
    )
    .all()
    .map((row) => ({ ...row, payload: JSON.parse(row.payload) }));
}

const types = () => queued().map((q) => q.type);

describe("enqueue", () => {
  test("writes nothing while no endpoint exists, whatever happens", async () => {
    const fx = await runtimeFixture(t);
    await activatedDevice(t, fx);
    expect(t.deps.sqlite.query("SELECT count(*) AS n FROM webhook_events").get()).toEqual({ n: 0 });
    expect(t.deps.sqlite.query("SELECT count(*) AS n FROM webhook_deliveries").get()).toEqual({ n: 0 });
  });

  test("an audit event reaches the endpoint as the audit event itself, in the same environment", async () => {
    subscribe(["product.created"]);
    const product = await t.call("POST", "/mgmt/v1/products", {
      key: t.keys.test,
      body: { name: "P", code: "p-one", environment: "test" },
      headers: t.idem(),
    });
    const [event] = queued();
    expect(event?.environment).toBe("test");
    const audit = await t.call("GET", "/mgmt/v1/events", { key: t.keys.test });
    expect(event?.payload).toMatchObject({ type: "product.created", environment: "test" });
    expect(event?.payload.data).toEqual(audit.body.data[0]);
    expect(event?.payload.data.target.id).toBe(product.body.data.public_id);
  });

  test("a change that rolls back queues nothing", () => {
    subscribe(["*"]);
    const before = types().length;
    expect(() =>
      t.deps.db.transaction((tx) => {
        recordAudit(tx, t.deps, cli, { type: "customer.created", target: { type: "customer", id: "cus_x" } });
        throw new Error("the change failed after its audit event");
      }),
    ).toThrow("the change failed");
    expect(types()).toHaveLength(before);
  });

  test("a refused request queues nothing", async () => {
    subscribe(["*"]);
    const before = types().length;
    const response = await t.call("POST", "/mgmt/v1/customers", {
      body: { notes: "no name" },
      headers: t.idem(),
    });
    expect(response.status).toBe(422);
    expect(types()).toHaveLength(before);
  });
});

describe("runtime events", () => {
  test("activation.created when a device activates, not when it activates again", async () => {
    const fx = await runtimeFixture(t);
    subscribe(["activation.created"]);
    const d = await activatedDevice(t, fx);
    expect(types()).toEqual(["activation.created"]);
    expect(queued()[0]?.payload.data).toMatchObject({
      type: "activation.created",
      actor: { type: "device" },
      target: { type: "activation", id: d.activationId, environment: "live" },
      data: { license_id: fx.licenseId, product_id: fx.productId },
    });
    const again = await activate(t, d.device, fx);
    expect(again.body.data.activation_id).toBe(d.activationId);
    expect(types()).toEqual(["activation.created"]);
  });

  test("activation.deactivated once when the device deactivates, with the reason", async () => {
    const fx = await runtimeFixture(t);
    subscribe(["activation.deactivated"]);
    const d = await activatedDevice(t, fx);
    const response = await proofCall(
      t,
      d.device,
      "DELETE",
      `/runtime/v1/activations/${d.activationId}`,
      d.activationId,
    );
    expect(response.status).toBe(200);
    expect(types()).toEqual(["activation.deactivated"]);
    expect(queued()[0]?.payload.data).toMatchObject({
      actor: { type: "device" },
      target: { id: d.activationId },
      data: { reason: "device", license_id: fx.licenseId },
    });
  });

  test("activation.created for a device bound by an offline package, beside the audit event", async () => {
    const fx = await runtimeFixture(t, {
      policy: { validation_mode: "offline", max_machines: 2 },
      license: { expires_at: new Date(t.clock.now().getTime() + 90 * 86_400_000).toISOString() },
    });
    subscribe(["activation.created", "license.offline_package_issued"]);
    const config = await integrationConfig(t, fx.productId);
    const request = await sdkClient(t, config).createOfflineRequest({ machineInfo: MACHINE });
    expect((await requestPackage(t, fx.licenseId, request)).status).toBe(200);
    expect(types().sort()).toEqual(["activation.created", "license.offline_package_issued"]);
    const created = queued().find((q) => q.type === "activation.created");
    const issued = queued().find((q) => q.type === "license.offline_package_issued");
    expect(created?.payload.data.target.id).toBe(issued?.payload.data.data.activation_id as string);
  });

  test("a vendor's force-deactivation is announced once, by its audit event", async () => {
    const fx = await runtimeFixture(t);
    subscribe(["activation.deactivated"]);
    const d = await activatedDevice(t, fx);
    expect((await t.call("DELETE", `/mgmt/v1/activations/${d.activationId}`)).status).toBe(204);
    expect(types()).toEqual(["activation.deactivated"]);
    expect(queued()[0]?.payload.data.actor.type).toBe("api_key");
  });

  test("license.expired once when a license's expiry passes, also after a downtime", async () => {
    subscribe(["license.expired"]);
    announceExpiries(t.deps);
    const expiresAt = new Date(t.clock.now().getTime() + 3_600_000).toISOString();
    const fx = await runtimeFixture(t, { license: { expires_at: expiresAt } });
    expect(announceExpiries(t.deps).queued).toBe(0);
    t.clock.advance(2 * 3600);
    expect(announceExpiries(t.deps).queued).toBe(1);
    expect(announceExpiries(t.deps).queued).toBe(0);
    expect(queued().filter((q) => q.type === "license.expired")).toHaveLength(1);
    expect(queued().at(-1)?.payload.data).toMatchObject({
      actor: { type: "system" },
      target: { type: "license", id: fx.licenseId },
      data: { expires_at: expiresAt, product_id: fx.productId },
    });
  });

  test("after the clock stepped back an hour, a license expiring within that hour is still announced, and one announced before is not again", async () => {
    subscribe(["license.expired"]);
    announceExpiries(t.deps);
    const early = await runtimeFixture(t, {
      license: { expires_at: new Date(t.clock.now().getTime() + 60_000).toISOString() },
    });
    t.clock.advance(120);
    expect(announceExpiries(t.deps).queued).toBe(1);
    t.clock.advance(-3600);
    const late = await runtimeFixture(t, {
      license: { expires_at: new Date(t.clock.now().getTime() + 1_800_000).toISOString() },
    });
    announceExpiries(t.deps);
    t.clock.advance(1800 + 60);
    expect(announceExpiries(t.deps).queued).toBe(1);
    t.clock.advance(3600);
    expect(announceExpiries(t.deps).queued).toBe(0);
    const announced = queued()
      .filter((q) => q.type === "license.expired")
      .map((q) => q.payload.data.target.id);
    expect(announced).toEqual([early.licenseId, late.licenseId]);
  });

  test("a license changed after its expiry passed, before the next scan, is still announced once", async () => {
    subscribe(["license.expired"]);
    announceExpiries(t.deps);
    const expiresAt = new Date(t.clock.now().getTime() + 3_600_000).toISOString();
    const fx = await runtimeFixture(t, { license: { expires_at: expiresAt } });
    t.clock.advance(3600 + 10);
    const patch = { body: { metadata: { note: "after expiry" } } };
    expect((await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, patch)).status).toBe(200);
    expect(announceExpiries(t.deps).queued).toBe(1);
    t.clock.advance(60);
    expect(announceExpiries(t.deps).queued).toBe(0);
    expect(queued().filter((q) => q.type === "license.expired")).toHaveLength(1);
  });

  test("an expiry moved later is announced again when it passes, also if the license changed since", async () => {
    subscribe(["license.expired"]);
    announceExpiries(t.deps);
    const fx = await runtimeFixture(t, {
      license: { expires_at: new Date(t.clock.now().getTime() + 60_000).toISOString() },
    });
    t.clock.advance(120);
    expect(announceExpiries(t.deps).queued).toBe(1);
    const later = new Date(t.clock.now().getTime() + 60_000).toISOString();
    const renew = { body: { expires_at: later } };
    expect((await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, renew)).status).toBe(200);
    t.clock.advance(70);
    const suspend = { body: { status_action: "suspended" } };
    expect((await t.call("PATCH", `/mgmt/v1/licenses/${fx.licenseId}`, suspend)).status).toBe(200);
    expect(announceExpiries(t.deps).queued).toBe(1);
    expect(announceExpiries(t.deps).queued).toBe(0);
    const expiries = queued().filter((q) => q.type === "license.expired");
    expect(expiries).toHaveLength(2);
    expect(expiries.at(-1)?.payload.data.data.expires_at).toBe(later);
  });

  test("the expiry scan reads only the licenses whose expiry it announces, not the whole table", async () => {
    subscribe(["license.expired"]);
    announceExpiries(t.deps);
    t.clock.advance(60);
    const { sql } = await sqlPreparedDuring(t.deps.sqlite, () => announceExpiries(t.deps));
    const scan = sql.find((text) => /FROM licenses/.test(text));
    expect(scan).toBeDefined();
    expect(queryPlan(t.deps.sqlite, scan as string)).toMatch(
      /^SEARCH licenses USING INDEX \w+ \(expires_at>\? AND expires_at<\?\)/,
    );
  });

  test("a revoked license's expiry is not announced, nor anything before the first scan", async () => {
    subscribe(["license.expired"]);
    const soon = new Date(t.clock.now().getTime() + 60_000).toISOString();
    const revoked = await runtimeFixture(t, { license: { expires_at: soon } });
    await t.call("DELETE", `/mgmt/v1/licenses/${revoked.licenseId}`);
    t.clock.advance(120);
    // The first scan only sets the mark.
    expect(announceExpiries(t.deps).queued).toBe(0);
    await runtimeFixture(t, {
      license: { expires_at: new Date(t.clock.now().getTime() + 60_000).toISOString() },
    });
    t.clock.advance(120);
    expect(announceExpiries(t.deps).queued).toBe(1);
  });

  test("lease.expired when a lease was not kept, not when it was released", async () => {
    const fx = await runtimeFixture(t, {
      policy: { max_machines: 10, max_concurrent: 3, concurrency_unit: "instance", lease_ttl_sec: 600 },
    });
    subscribe(["lease.expired"]);
    announceExpiries(t.deps);
    const d = await activatedDevice(t, fx);
    const take = (instance: string) =>
      proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, {
        activation_id: d.activationId,
        instance_id: instance,
      });
    const kept = (await take("a")).body.data;
    const released = (await take("b")).body.data;
    await proofCall(t, d.device, "DELETE", `/runtime/v1/leases/${released.lease_id}`, d.activationId, {
      instance_id: "b",
    });
    t.clock.advance(601);
    expect(announceExpiries(t.deps).queued).toBe(1);
    expect(queued()[0]?.payload.data).toMatchObject({
      target: { type: "lease", id: kept.lease_id },
      data: { activation_id: d.activationId, license_id: fx.licenseId },
    });
  });
});

describe("retention", () => {
  test("finished deliveries go with their attempts and events after 30 days; queued ones stay", async () => {
    subscribe(["customer.created"]);
    for (const name of ["old-done", "old-queued"]) {
      await t.call("POST", "/mgmt/v1/customers", { body: { name }, headers: t.idem() });
    }
    const [done, queuedOne] = t.deps.sqlite
      .query<{ id: string }, []>("SELECT id FROM webhook_deliveries ORDER BY id")
      .all() as { id: string }[];
    const now = t.clock.now().getTime();
    t.deps.sqlite.run(
      "UPDATE webhook_deliveries SET status = 'succeeded', attempts = 1, completed_at = ? WHERE id = ?",
      [now, done?.id as string],
    );
    t.deps.sqlite.run(
      "INSERT INTO webhook_attempts (id, delivery_id, number, started_at, duration_ms, outcome) VALUES ('wha_1', ?, 1, ?, 5, 'succeeded')",
      [done?.id as string, now],
    );
    t.clock.advance(29 * 86_400);
    expect(await purgeFinishedDeliveries(t.deps)).toBe(0);
    t.clock.advance(2 * 86_400);
    await t.call("POST", "/mgmt/v1/customers", { body: { name: "recent" }, headers: t.idem() });
    expect(await purgeFinishedDeliveries(t.deps)).toBe(1);
    const left = t.deps.sqlite
      .query<{ id: string }, []>("SELECT id FROM webhook_deliveries ORDER BY id")
      .all();
    expect(left.map((row) => row.id)).toEqual([queuedOne?.id as string, expect.any(String)]);
    expect(t.deps.sqlite.query("SELECT count(*) AS n FROM webhook_attempts").get()).toEqual({ n: 0 });
    expect(t.deps.sqlite.query("SELECT count(*) AS n FROM webhook_events").get()).toEqual({ n: 2 });
  });

  test("one pass deletes a backlog of any size in chunks, giving the event loop turns between them", async () => {
    const endpoint = subscribe(["customer.created"]);
    const insertEvent = t.deps.sqlite.prepare<unknown, [string, number]>(
      "INSERT INTO webhook_events (id, environment, type, payload, created_at) VALUES (?, 'live', 'customer.created', '{}', ?)",
    );
    const insertDelivery = t.deps.sqlite.prepare<unknown, [string, string, string, number]>(
      `INSERT INTO webhook_deliveries (id, endpoint_id, event_id, environment, event_type, status, attempts,
         schedule_start, next_attempt_at, created_at, updated_at, completed_at)
       VALUES (?1, ?2, ?3, 'live', 'customer.created', 'succeeded', 1, 0, ?4, ?4, ?4, ?4)`,
    );
    // Ids made at the times given (the context's own generator never goes back in time).
    const ids = new IdGenerator();
    const now = t.clock.now().getTime();
    const write = (count: number, at: number) =>
      t.deps.sqlite.transaction(() => {
        for (let i = 0; i < count; i++) {
          const event = `msg_${ids.ulid(at + i)}`;
          insertEvent.run(event, at + i);
          insertDelivery.run(`whd_${ids.ulid(at + i)}`, endpoint.id, event, at + i);
        }
      })();
    write(12_001, now - 40 * 86_400_000);
    write(3, now - 86_400_000);
    const count = () =>
      t.deps.sqlite
        .query<{ deliveries: number; events: number }, []>(
          "SELECT (SELECT count(*) FROM webhook_deliveries) AS deliveries, (SELECT count(*) FROM webhook_events) AS events",
        )
        .get();
    const pass = purgeFinishedDeliveries(t.deps);
    // The first chunk is gone, the rest waits for later turns of the event loop.
    const between = count()?.deliveries ?? 0;
    expect(between).toBeLessThan(12_004);
    expect(between).toBeGreaterThan(3);
    expect(await pass).toBe(12_001);
    expect(count()).toEqual({ deliveries: 3, events: 3 });
  });
});
