import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * Customers, resellers and webhook endpoints are shared by both environments, so a test key (kept
 * on CI runners and developers' machines) can change records live keys rely on. Such a change is
 * recorded in the live audit log too, naming the test key, so the live side sees what changed its
 * data and who; webhook endpoints, which receive both environments, get it once, as that live event.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const eventsOf = async (key: string, targetId: string) =>
  ((await t.call("GET", "/mgmt/v1/events?limit=100", { key })).body.data as Record<string, unknown>[])
    .filter((event) => (event.target as { id?: string } | undefined)?.id === targetId)
    .map((event) => ({ type: event.type, actor: event.actor, data: event.data }));

describe.each([
  ["reseller", "/mgmt/v1/resellers", { name: "Partner GmbH" }, { name: "Renamed by a test key" }],
  ["customer", "/mgmt/v1/customers", { name: "Acme" }, { name: "Renamed by a test key" }],
] as const)("a shared %s", (kind, path, body, change) => {
  test("changed by a test key is in the live audit log too, naming the test key", async () => {
    const created = await t.call("POST", path, { body, headers: t.idem() });
    expect(created.status).toBe(201);
    const id = created.body.data.public_id as string;
    const etag = (await t.call("GET", `${path}/${id}`)).headers.get("etag") ?? "";
    const patched = await t.call("PATCH", `${path}/${id}`, {
      key: t.keys.test,
      body: change,
      headers: { "if-match": etag },
    });
    expect(patched.status).toBe(200);
    const live = await eventsOf(t.keys.live, id);
    expect(live.map((event) => event.type)).toEqual([`${kind}.updated`, `${kind}.created`]);
    const [updated] = live;
    const testKeyId = (await t.call("GET", "/mgmt/v1/events?limit=1", { key: t.keys.test })).body.data[0]
      .actor.id;
    expect(updated?.actor).toMatchObject({ type: "api_key", id: testKeyId });
    expect(await eventsOf(t.keys.test, id)).toEqual(live.slice(0, 1));
  });

  test("made by a test key is in both audit logs; made by a live key, in the live one only", async () => {
    const byTest = await t.call("POST", path, { key: t.keys.test, body, headers: t.idem() });
    const byLive = await t.call("POST", path, { body, headers: t.idem() });
    const testMade = byTest.body.data.public_id as string;
    const liveMade = byLive.body.data.public_id as string;
    expect((await eventsOf(t.keys.live, testMade)).map((event) => event.type)).toEqual([`${kind}.created`]);
    expect((await eventsOf(t.keys.test, testMade)).map((event) => event.type)).toEqual([`${kind}.created`]);
    expect(await eventsOf(t.keys.test, liveMade)).toEqual([]);
  });
});

test("a test key's change to a shared record reaches the live webhooks subscribed to it", async () => {
  const hook = await t.call("POST", "/mgmt/v1/webhooks", {
    body: { url: "https://hooks.example.com/in", events: ["reseller.updated"] },
  });
  expect(hook.status).toBe(201);
  const created = await t.call("POST", "/mgmt/v1/resellers", {
    body: { name: "Partner" },
    headers: t.idem(),
  });
  const id = created.body.data.public_id as string;
  const etag = (await t.call("GET", `/mgmt/v1/resellers/${id}`)).headers.get("etag") ?? "";
  const patched = await t.call("PATCH", `/mgmt/v1/resellers/${id}`, {
    key: t.keys.test,
    body: { organization_limit: 0 },
    headers: { "if-match": etag },
  });
  expect(patched.status).toBe(200);
  const queued = await t.call("GET", `/mgmt/v1/webhooks/${hook.body.data.public_id}/deliveries`);
  expect(
    queued.body.data.map((d: { event_type: string; environment: string }) => [d.event_type, d.environment]),
  ).toEqual([["reseller.updated", "live"]]);
});

test("webhook endpoint changes by a test key are in the live audit log too, naming the test key", async () => {
  const made = await t.call("POST", "/mgmt/v1/webhooks", {
    key: t.keys.test,
    body: { name: "exfil", url: "https://hooks.example.com/in", events: ["*"] },
  });
  expect(made.status).toBe(201);
  const id = made.body.data.public_id as string;
  const path = `/mgmt/v1/webhooks/${id}`;
  expect((await t.call("PATCH", path, { key: t.keys.test, body: { name: "renamed" } })).status).toBe(200);
  const rotated = await t.call("POST", `${path}/rotate-secret`, {
    key: t.keys.test,
    body: { overlap_sec: 0 },
  });
  expect(rotated.status).toBe(200);
  expect((await t.call("DELETE", path, { key: t.keys.test })).status).toBe(204);

  const live = await eventsOf(t.keys.live, id);
  expect(live.map((event) => event.type)).toEqual([
    "webhook.stopped",
    "webhook.secret_rotated",
    "webhook.updated",
    "webhook.created",
  ]);
  const testKeyId = (await t.call("GET", "/mgmt/v1/events?limit=1", { key: t.keys.test })).body.data[0].actor
    .id;
  for (const event of live) expect(event.actor).toMatchObject({ type: "api_key", id: testKeyId });
  expect(await eventsOf(t.keys.test, id)).toEqual(live);
});

test("webhook endpoint changes by a live key stay in the live audit log", async () => {
  const made = await t.call("POST", "/mgmt/v1/webhooks", { body: { url: "https://hooks.example.com/in" } });
  const id = made.body.data.public_id as string;
  expect((await eventsOf(t.keys.live, id)).map((event) => event.type)).toEqual(["webhook.created"]);
  expect(await eventsOf(t.keys.test, id)).toEqual([]);
});

describe("one change by a test key reaches each endpoint once", () => {
  interface Queued {
    endpoint_id: string;
    environment: string;
    payload: string;
  }
  /** Every delivery queued for `type`, of both environments, straight from the outbox. */
  const queuedFor = (type: string) =>
    t.deps.sqlite
      .query<Queued, [string]>(
        `SELECT d.endpoint_id, d.environment, e.payload FROM webhook_deliveries d
         JOIN webhook_events e ON e.id = d.event_id WHERE d.event_type = ? ORDER BY d.endpoint_id`,
      )
      .all(type)
      .map((row) => ({ ...row, payload: JSON.parse(row.payload) }));
  const endpoint = async (events: string[]) => {
    const made = await t.call("POST", "/mgmt/v1/webhooks", {
      body: { url: "https://hooks.example.com/in", events },
    });
    expect(made.status).toBe(201);
    return made.body.data.public_id as string;
  };

  test.each([
    ["customer.created", "/mgmt/v1/customers", { name: "Acme" }],
    ["reseller.created", "/mgmt/v1/resellers", { name: "Partner GmbH" }],
    [
      "webhook.created",
      "/mgmt/v1/webhooks",
      { url: "https://other.example.com/in", events: ["customer.created"] },
    ],
  ] as const)(
    "%s is delivered once per endpoint, as the live event naming the test key",
    async (type, path, body) => {
      const endpoints = [await endpoint(["*"]), await endpoint([type])].sort();
      const made = await t.call("POST", path, { key: t.keys.test, body, headers: t.idem() });
      expect(made.status).toBe(201);
      const id = made.body.data.public_id as string;

      const queued = queuedFor(type).filter((row) => row.payload.data.target.id === id);
      expect(queued.map((row) => row.endpoint_id)).toEqual(endpoints);
      const [live] = await t
        .call("GET", "/mgmt/v1/events?limit=100")
        .then((r) => (r.body.data as { target: { id: string } }[]).filter((event) => event.target.id === id));
      const testKeyId = (await t.call("GET", "/mgmt/v1/events?limit=1", { key: t.keys.test })).body.data[0]
        .actor.id;
      for (const row of queued) {
        expect(row.environment).toBe("live");
        expect(row.payload).toMatchObject({ type, environment: "live", data: live });
        expect(row.payload.data.actor).toMatchObject({ type: "api_key", id: testKeyId });
      }
      // The test copy is still in the test audit log; it is only not delivered a second time.
      expect((await eventsOf(t.keys.test, id)).map((event) => event.type)).toEqual([type]);
    },
  );

  test("a plan change, in both audit logs, is delivered once per endpoint, as the live event", async () => {
    const endpoints = [await endpoint(["*"]), await endpoint(["workspace.plan_changed"])].sort();
    t.workspace.setPlan("business", { type: "cli", id: "ops" });
    for (const key of [t.keys.live, t.keys.test]) {
      const events = (await t.call("GET", "/mgmt/v1/events?limit=1", { key })).body.data;
      expect(events.map((event: { type: string }) => event.type)).toEqual(["workspace.plan_changed"]);
    }
    const queued = queuedFor("workspace.plan_changed");
    expect(queued.map((row) => [row.endpoint_id, row.environment, row.payload.environment])).toEqual(
      endpoints.map((id) => [id, "live", "live"]),
    );
  });
});
