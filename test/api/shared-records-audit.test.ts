import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * Customers and resellers are shared by both environments, so a test key (kept on CI runners and
 * developers' machines) can change records live keys rely on. Such a change is recorded in the
 * live audit log too, naming the test key, so the live side sees what changed its data and who.
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
