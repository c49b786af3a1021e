import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { factories } from "../support/factories.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { storeDigest } from "../support/store-digest.ts";

/**
 * Webhook endpoints through the Management API (spec §4.3, §4.1, §2.4): create with the secret
 * shown once, idempotent replay, validation, the live/test sharing rule, team-chat destinations,
 * rotation and stopping. Delivery itself is in test/integration/webhook-delivery*.test.ts.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const HOOK = "https://receiver.example.com/hooks/licensing?tenant=7";
const SLACK = "https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX";

async function create(body: Record<string, unknown> = { url: HOOK }, key = t.keys.live) {
  return t.call("POST", "/mgmt/v1/webhooks", { key, body, headers: t.idem() });
}

const count = (table: string): number =>
  (t.deps.sqlite.query(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n;

describe("POST /mgmt/v1/webhooks", () => {
  test("creates an endpoint and shows its whsec_ secret in the create response only", async () => {
    const response = await create({
      name: "Billing",
      url: HOOK,
      events: ["license.created", "license.revoked"],
    });
    expect(response.status).toBe(201);
    const data = response.body.data;
    expect(data.public_id).toMatch(/^whk_[0-9A-HJKMNP-TV-Z]{26}$/);
    expect(data).toMatchObject({
      name: "Billing",
      url: HOOK,
      url_host: "receiver.example.com",
      destination: "webhook",
      events: ["license.created", "license.revoked"],
      status: "active",
      disabled_reason: null,
      secret_rotation: { scheduled: false, activates_at: null },
    });
    expect(data.secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    expect(Buffer.from(data.secret.slice(6), "base64")).toHaveLength(32);

    const secret: string = data.secret;
    const got = await t.call("GET", `/mgmt/v1/webhooks/${data.public_id}`);
    const list = await t.call("GET", "/mgmt/v1/webhooks");
    const patched = await t.call("PATCH", `/mgmt/v1/webhooks/${data.public_id}`, { body: { name: "B2" } });
    const events = await t.call("GET", "/mgmt/v1/events");
    for (const later of [got, list, patched, events]) {
      expect(later.status).toBe(200);
      expect(later.text).not.toContain(secret);
      expect(later.text).not.toContain(secret.slice(6));
      expect(later.text).not.toContain('"secret"');
    }
    expect(got.body.data).toEqual({ ...data, secret: undefined });
    expect(list.body.data.map((w: { public_id: string }) => w.public_id)).toEqual([data.public_id]);
    expect(events.body.data[1]).toMatchObject({
      type: "webhook.created",
      target: { type: "webhook", id: data.public_id },
      data: { url_host: "receiver.example.com", destination: "webhook" },
    });
  });

  test("defaults the name to the host and the events to every event", async () => {
    const response = await create({ url: HOOK });
    expect(response.body.data).toMatchObject({ name: "receiver.example.com", events: ["*"] });
  });

  test("stores the secret and the URL only encrypted, in the store and its WAL", async () => {
    const response = await create({ url: SLACK.replace("hooks.slack.com", "secret-host.example.com") });
    const slack = await create({ url: SLACK });
    const secret: string = response.body.data.secret;
    const needles = [
      secret,
      secret.slice(6),
      Buffer.from(secret.slice(6), "base64").toString("hex"),
      "XXXXXXXXXXXXXXXXXXXXXXXX",
    ];
    expect(slack.status).toBe(201);
    const files = readdirSync(t.dir).filter((name) => name.startsWith("licensing.db"));
    expect(files.length).toBeGreaterThan(0);
    for (const name of files) {
      const bytes = readFileSync(join(t.dir, name));
      expect(bytes.includes(Buffer.from(secret.slice(6), "base64"))).toBe(false);
      for (const needle of needles)
        expect({ name, needle, found: bytes.includes(needle) }).toEqual({ name, needle, found: false });
    }
  });

  test("replays the first response, secret included, for the same Idempotency-Key and body, and creates one endpoint", async () => {
    const headers = { "idempotency-key": "webhook-create-0001" };
    const body = { url: HOOK, events: ["*"] };
    const first = await t.call("POST", "/mgmt/v1/webhooks", { body, headers });
    const again = await t.call("POST", "/mgmt/v1/webhooks", { body: { events: ["*"], url: HOOK }, headers });
    expect(first.status).toBe(201);
    expect(again.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.body).toEqual(first.body);
    expect(again.body.data.secret).toBe(first.body.data.secret);
    expect(count("webhook_endpoints")).toBe(1);
    const other = await t.call("POST", "/mgmt/v1/webhooks", {
      body: { url: HOOK, events: ["license.created"] },
      headers,
    });
    expect(other.status).toBe(409);
    expect(other.body.error.code).toBe("IDEMPOTENCY_CONFLICT");
    expect(count("webhook_endpoints")).toBe(1);
  });

  test("works without an Idempotency-Key, and refuses a malformed one with 400", async () => {
    const without = await t.call("POST", "/mgmt/v1/webhooks", { body: { url: HOOK } });
    expect(without.status).toBe(201);
    const bad = await t.call("POST", "/mgmt/v1/webhooks", {
      body: { url: HOOK },
      headers: { "idempotency-key": "short" },
    });
    expect(bad.status).toBe(400);
    expect(bad.body.error.code).toBe("INVALID_REQUEST");
  });

  test.each([
    ["an unknown event name", { url: HOOK, events: ["license.exploded"] }, "events/0"],
    ["a repeated event name", { url: HOOK, events: ["license.created", "license.created"] }, "events"],
    ["no events", { url: HOOK, events: [] }, "events"],
    ["no url", { events: ["*"] }, "url"],
    ["a url that is not one", { url: "not a url" }, "url"],
    ["another scheme", { url: "ftp://receiver.example.com/x" }, "url"],
    ["plain http (private networks not allowed)", { url: "http://receiver.example.com/x" }, "url"],
    ["credentials in the url", { url: "https://user:pw@receiver.example.com/x" }, "url"],
    ["a fragment", { url: "https://receiver.example.com/x#frag" }, "url"],
    ["an empty fragment", { url: "https://receiver.example.com/x#" }, "url"],
    ["port 0", { url: "https://receiver.example.com:0/x" }, "url"],
    ["port 0 written with leading zeros", { url: "https://receiver.example.com:000/x" }, "url"],
    ["an empty label in the host", { url: "https://receiver..example.com/x" }, "url"],
    ["a wildcard host", { url: "https://*.example.com/x" }, "url"],
    ["a label starting with a hyphen", { url: "https://-receiver.example.com/x" }, "url"],
    ["a label longer than 63 characters", { url: `https://${"r".repeat(64)}.example.com/x` }, "url"],
    ["a loopback address", { url: "https://127.0.0.1/x" }, "url"],
    ["an IPv6 loopback address", { url: "https://[::1]/x" }, "url"],
    ["the cloud metadata address", { url: "https://169.254.169.254/latest" }, "url"],
    ["a private address in IPv4-mapped IPv6 form", { url: "https://[::ffff:10.0.0.1]/x" }, "url"],
    ["a unique-local IPv6 address", { url: "https://[fd00:ec2::254]/x" }, "url"],
    ["localhost by name", { url: "https://localhost/x" }, "url"],
    ["a name under .localhost", { url: "https://app.localhost./x" }, "url"],
    [
      "no host, which a URL parser would take from the path",
      { url: "https:///receiver.example.com/x" },
      "url",
    ],
    [
      "a control character, which a URL parser would drop",
      { url: "https://receiver.example.com/x\u0000" },
      "url",
    ],
    ["a space", { url: "https://receiver.example.com/a b" }, "url"],
    [
      "a backslash, which a URL parser reads as a slash",
      { url: "https://receiver.example.com\\@evil.example/x" },
      "url",
    ],
    ["an empty userinfo", { url: "https://@receiver.example.com/x" }, "url"],
    ["an overlong name", { url: HOOK, name: "n".repeat(201) }, "name"],
    ["an unknown field", { url: HOOK, secret: "whsec_mine" }, "secret"],
  ])("refuses %s with 422 naming the field, and stores nothing", async (_what, body, field) => {
    const before = storeDigest(t.deps.sqlite);
    const response = await create(body);
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("VALIDATION_FAILED");
    expect(Object.keys(response.body.error.details.errors)).toContain(field);
    expect(storeDigest(t.deps.sqlite)).toBe(before);
  });

  test.each([
    "https://bücher.example/hooks",
    "https://receiver.example.com./x",
    "https://Receiver-1.Example.com:8443/x?q=1",
    "https://a_b.example.com/x",
    "https://[2606:4700:4700::1111]/x",
  ])("accepts the host of %s", async (url) => {
    const response = await create({ url });
    expect(response.status).toBe(201);
  });

  test("accepts every catalogue name and the wildcard", async () => {
    const catalogue = readFileSync(join(import.meta.dir, "../../docs/api.md"), "utf8");
    const start = catalogue.indexOf("### Webhook events");
    const section = catalogue.slice(start, catalogue.indexOf("\n### ", start + 5));
    const names = [...new Set([...section.matchAll(/`([a-z_]+\.[a-z_]+)`/g)].map((m) => m[1] as string))];
    expect(names.length).toBeGreaterThan(30);
    const response = await create({ url: HOOK, events: [...names, "*"] });
    expect(response.status).toBe(201);
  });
});

describe("team-chat destinations", () => {
  test.each([
    ["slack", SLACK],
    ["discord", "https://discord.com/api/webhooks/123456/abcdefTOKEN"],
    ["discord", "https://discordapp.com/api/webhooks/123456/abcdefTOKEN"],
    [
      "teams",
      "https://prod-42.westeurope.logic.azure.com:443/workflows/abc/triggers/manual/paths/invoke?sig=SIGNATURE",
    ],
    // The last segment is the secret part the test looks for: long enough not to occur by chance in ids.
    ["teams", "https://contoso.webhook.office.com/webhookb2/abc@def/IncomingWebhook/123/f00dSECRETc0de"],
    [
      "teams",
      "https://default1234.56.environment.api.powerplatform.com/powerautomate/automations/direct/workflows/wf77?sig=SIGNATURE",
    ],
  ])("a %s URL is recognised, gets no secret, and its URL is never returned", async (kind, url) => {
    const response = await create({ url, name: "Team" });
    expect(response.status).toBe(201);
    const host = new URL(url).hostname;
    expect(response.body.data).toMatchObject({ destination: kind, url: null, url_host: host, secret: null });
    const parsed = new URL(url);
    const secretPart = parsed.searchParams.get("sig") ?? (parsed.pathname.split("/").at(-1) as string);
    const got = await t.call("GET", `/mgmt/v1/webhooks/${response.body.data.public_id}`);
    const list = await t.call("GET", "/mgmt/v1/webhooks");
    const events = await t.call("GET", "/mgmt/v1/events");
    for (const text of [response.text, got.text, list.text, events.text]) {
      expect(text).not.toContain(url);
      expect(text).not.toContain(secretPart);
    }
    const rotate = await t.call("POST", `/mgmt/v1/webhooks/${response.body.data.public_id}/rotate-secret`, {
      body: {},
    });
    expect(rotate.status).toBe(422);
    expect(rotate.body.error.code).toBe("INVALID_TRANSITION");
  });

  test("a Discord host outside /api/webhooks/ is an ordinary signed endpoint", async () => {
    const response = await create({ url: "https://discord.com/other/path" });
    expect(response.body.data).toMatchObject({
      destination: "webhook",
      url: "https://discord.com/other/path",
    });
    expect(response.body.data.secret).toMatch(/^whsec_/);
  });

  test("an endpoint cannot change between a signed receiver and a chat destination", async () => {
    const signed = await create({ url: HOOK });
    const response = await t.call("PATCH", `/mgmt/v1/webhooks/${signed.body.data.public_id}`, {
      body: { url: SLACK },
    });
    expect(response.status).toBe(422);
    expect(response.body.error.details.errors.url).toBeDefined();
  });
});

describe("live and test share endpoints", () => {
  test("without live products a test key creates, changes and stops endpoints, and a live key sees them", async () => {
    const made = await create({ url: HOOK }, t.keys.test);
    expect(made.status).toBe(201);
    const id = made.body.data.public_id;
    expect(
      (await t.call("PATCH", `/mgmt/v1/webhooks/${id}`, { key: t.keys.test, body: { name: "T" } })).status,
    ).toBe(200);
    expect((await t.call("GET", `/mgmt/v1/webhooks/${id}`)).body.data.name).toBe("T");
    expect((await t.call("DELETE", `/mgmt/v1/webhooks/${id}`, { key: t.keys.test })).status).toBe(204);
  });

  test("with a live product a test key gets 403 ENVIRONMENT_MISMATCH on every change, and nothing changes", async () => {
    const made = await create({ url: HOOK });
    const id = made.body.data.public_id;
    factories(t).product({ environment: "live" });
    const before = storeDigest(t.deps.sqlite);
    const attempts = [
      await create({ url: HOOK }, t.keys.test),
      await t.call("PATCH", `/mgmt/v1/webhooks/${id}`, { key: t.keys.test, body: { name: "T" } }),
      await t.call("DELETE", `/mgmt/v1/webhooks/${id}`, { key: t.keys.test }),
      await t.call("POST", `/mgmt/v1/webhooks/${id}/rotate-secret`, { key: t.keys.test, body: {} }),
    ];
    for (const response of attempts) {
      expect(response.status).toBe(403);
      expect(response.body.error.code).toBe("ENVIRONMENT_MISMATCH");
      expect(response.text).not.toContain("whsec_");
    }
    expect(storeDigest(t.deps.sqlite)).toBe(before);
    // Reading stays allowed: the endpoints are shared.
    const list = await t.call("GET", "/mgmt/v1/webhooks", { key: t.keys.test });
    expect(list.body.data.map((w: { public_id: string }) => w.public_id)).toEqual([id]);
    expect((await t.call("GET", `/mgmt/v1/webhooks/${id}`, { key: t.keys.test })).status).toBe(200);
  });

  test("a test product alone does not make the workspace live", async () => {
    factories(t).product({ environment: "test" });
    expect((await create({ url: HOOK }, t.keys.test)).status).toBe(201);
  });
});

describe("PATCH and DELETE /mgmt/v1/webhooks/{id}", () => {
  test("changes only the fields sent and records which", async () => {
    const made = await create({ url: HOOK, events: ["license.created"] });
    const id = made.body.data.public_id;
    const response = await t.call("PATCH", `/mgmt/v1/webhooks/${id}`, {
      body: { url: "https://other.example.org/in", events: ["*"] },
    });
    expect(response.status).toBe(200);
    expect(response.body.data).toMatchObject({
      name: "receiver.example.com",
      url: "https://other.example.org/in",
      url_host: "other.example.org",
      events: ["*"],
    });
    const events = await t.call("GET", "/mgmt/v1/events");
    expect(events.body.data[0]).toMatchObject({
      type: "webhook.updated",
      data: { changes: ["url", "events"] },
    });
    const same = await t.call("PATCH", `/mgmt/v1/webhooks/${id}`, { body: { events: ["*"] } });
    expect(same.body.data.updated_at).toBe(response.body.data.updated_at);
  });

  test("stops an endpoint: 204, still readable as stopped, queued deliveries cancelled; repeating changes nothing", async () => {
    const made = await create({ url: HOOK, events: ["customer.created"] });
    const id = made.body.data.public_id;
    await t.call("POST", "/mgmt/v1/customers", { body: { name: "Ada" }, headers: t.idem() });
    expect(t.deps.sqlite.query("SELECT status FROM webhook_deliveries").all()).toEqual([
      { status: "pending" },
    ]);
    const stopped = await t.call("DELETE", `/mgmt/v1/webhooks/${id}`);
    expect(stopped.status).toBe(204);
    expect(t.deps.sqlite.query("SELECT status FROM webhook_deliveries").all()).toEqual([
      { status: "cancelled" },
    ]);
    expect((await t.call("GET", `/mgmt/v1/webhooks/${id}`)).body.data.status).toBe("stopped");
    const digest = storeDigest(t.deps.sqlite);
    expect((await t.call("DELETE", `/mgmt/v1/webhooks/${id}`)).status).toBe(204);
    expect(storeDigest(t.deps.sqlite)).toBe(digest);
    // A stopped endpoint receives nothing new and cannot change.
    await t.call("POST", "/mgmt/v1/customers", { body: { name: "Bob" }, headers: t.idem() });
    expect(count("webhook_deliveries")).toBe(1);
    const patch = await t.call("PATCH", `/mgmt/v1/webhooks/${id}`, { body: { name: "again" } });
    expect(patch.status).toBe(422);
    expect(patch.body.error.code).toBe("INVALID_TRANSITION");
  });

  test("a disabled endpoint is re-enabled with status active", async () => {
    const made = await create({ url: HOOK });
    const id = made.body.data.public_id;
    t.deps.sqlite.run(
      "UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = 'gone' WHERE id = ?",
      [id],
    );
    expect((await t.call("GET", `/mgmt/v1/webhooks/${id}`)).body.data).toMatchObject({
      status: "disabled",
      disabled_reason: "gone",
    });
    const response = await t.call("PATCH", `/mgmt/v1/webhooks/${id}`, { body: { status: "active" } });
    expect(response.body.data).toMatchObject({ status: "active", disabled_reason: null });
  });

  test("unknown and malformed ids answer 404", async () => {
    for (const id of ["whk_01M81Z00000000000000000000", "nope", "prod_01M81Z00000000000000000000"]) {
      const response = await t.call("GET", `/mgmt/v1/webhooks/${id}`);
      expect(response.status).toBe(404);
      expect(response.body.error.code).toBe("NOT_FOUND");
    }
  });
});

describe("POST /mgmt/v1/webhooks/{id}/rotate-secret", () => {
  test("returns a new secret once; both sign until activates_at, then only the new one", async () => {
    const made = await create({ url: HOOK });
    const id = made.body.data.public_id;
    const rotated = await t.call("POST", `/mgmt/v1/webhooks/${id}/rotate-secret`, {
      body: { overlap_sec: 3600 },
    });
    expect(rotated.status).toBe(200);
    expect(rotated.body.data.secret).toMatch(/^whsec_/);
    expect(rotated.body.data.secret).not.toBe(made.body.data.secret);
    const activatesAt = new Date(Date.parse(rotated.body.data.updated_at) + 3600_000).toISOString();
    expect(rotated.body.data.secret_rotation).toEqual({ scheduled: true, activates_at: activatesAt });
    const got = await t.call("GET", `/mgmt/v1/webhooks/${id}`);
    expect(got.body.data.secret_rotation).toEqual({ scheduled: true, activates_at: activatesAt });
    expect(got.text).not.toContain(rotated.body.data.secret);
    const events = await t.call("GET", "/mgmt/v1/events");
    expect(events.body.data[0]).toMatchObject({
      type: "webhook.secret_rotated",
      data: { overlap_sec: 3600 },
    });
    expect(events.text).not.toContain("whsec_");
    t.clock.advance(3601);
    const later = await t.call("GET", `/mgmt/v1/webhooks/${id}`);
    expect(later.body.data.secret_rotation).toEqual({ scheduled: false, activates_at: null });
  });

  test("defaults to a one-day overlap, takes an empty body, and overlap_sec 0 retires the old secret at once", async () => {
    const made = await create({ url: HOOK });
    const id = made.body.data.public_id;
    const byDefault = await t.call("POST", `/mgmt/v1/webhooks/${id}/rotate-secret`, { body: {} });
    expect(byDefault.body.data.secret_rotation.activates_at).toBe(
      new Date(Date.parse(byDefault.body.data.updated_at) + 86_400_000).toISOString(),
    );
    const now = await t.call("POST", `/mgmt/v1/webhooks/${id}/rotate-secret`, { body: { overlap_sec: 0 } });
    expect(now.body.data.secret_rotation).toEqual({ scheduled: false, activates_at: null });
    for (const overlap of [-1, 7 * 86_400 + 1, "60"]) {
      const bad = await t.call("POST", `/mgmt/v1/webhooks/${id}/rotate-secret`, {
        body: { overlap_sec: overlap },
      });
      expect(bad.status).toBe(422);
    }
  });

  test("without a body it rotates with the default overlap; a body that is sent is still validated", async () => {
    const id = (await create({ url: HOOK })).body.data.public_id;
    const rotate = (rawBody?: string, type = "application/json") =>
      t.call("POST", `/mgmt/v1/webhooks/${id}/rotate-secret`, {
        rawBody,
        headers: rawBody === undefined ? {} : { "content-type": type },
      });
    const bare = await rotate();
    expect(bare.status).toBe(200);
    expect(bare.body.data.secret_rotation.activates_at).toBe(
      new Date(Date.parse(bare.body.data.updated_at) + 86_400_000).toISOString(),
    );
    expect((await rotate("")).status).toBe(200);
    const before = storeDigest(t.deps.sqlite);
    const refused: number[] = [];
    for (const body of ["null", "[]", "5", '{"x":1}', "{"]) refused.push((await rotate(body)).status);
    refused.push((await rotate("overlap_sec=5", "text/plain")).status);
    expect(refused).toEqual([422, 422, 422, 422, 400, 400]);
    expect(storeDigest(t.deps.sqlite)).toEqual(before);
  });
});

describe("the webhooks plan feature", () => {
  test("on a plan without webhooks, creating an endpoint is 403 PLAN_ENTITLEMENT_REQUIRED naming the feature, and nothing is stored", async () => {
    t.workspace.setPlan("free");
    const before = storeDigest(t.deps.sqlite);
    const refused = await create();
    expect([refused.status, refused.body.error.code, refused.body.error.details]).toEqual([
      403,
      "PLAN_ENTITLEMENT_REQUIRED",
      { entitlement: "webhooks" },
    ]);
    expect(storeDigest(t.deps.sqlite)).toBe(before);
  });

  test("after a downgrade an endpoint can be read, renamed, rotated and stopped, but not widened; no event is queued until the plan has webhooks again", async () => {
    const id = (await create()).body.data.public_id as string;
    const product = (name: string, code: string) =>
      t.call("POST", "/mgmt/v1/products", { body: { name, code }, headers: t.idem() });
    // The endpoint's own webhook.created.
    expect(count("webhook_deliveries")).toBe(1);
    t.workspace.setPlan("free");

    expect((await product("Quiet", "quiet")).status).toBe(201);
    expect(count("webhook_deliveries")).toBe(1);

    const path = `/mgmt/v1/webhooks/${id}`;
    expect((await t.call("GET", path)).status).toBe(200);
    expect((await t.call("PATCH", path, { body: { name: "Renamed" } })).status).toBe(200);
    for (const body of [{ url: "https://other.example.com/hook" }, { events: ["license.created"] }]) {
      const widened = await t.call("PATCH", path, { body });
      expect({ body, status: widened.status, code: widened.body.error?.code }).toEqual({
        body,
        status: 403,
        code: "PLAN_ENTITLEMENT_REQUIRED",
      });
    }
    expect((await t.call("POST", `${path}/rotate-secret`, { body: {} })).status).toBe(200);

    t.workspace.setPlan("personal");
    expect((await product("Heard", "heard")).status).toBe(201);
    expect(count("webhook_deliveries")).toBe(2);
    expect((await t.call("DELETE", path)).status).toBe(204);
  });
});

describe("the webhooks plan feature and replays", () => {
  test("without the feature a finished delivery is not sent again: replay is 403 and the delivery stays as it was", async () => {
    const id = (await create()).body.data.public_id as string;
    const delivery = t.deps.sqlite.query("SELECT id FROM webhook_deliveries").get() as { id: string };
    t.deps.sqlite.run("UPDATE webhook_deliveries SET status = 'failed', completed_at = 1 WHERE id = ?", [
      delivery.id,
    ]);
    const replay = () => t.call("POST", `/mgmt/v1/webhooks/${id}/deliveries/${delivery.id}/replay`);
    t.workspace.setPlan("free");
    const refused = await replay();
    expect([refused.status, refused.body.error.code]).toEqual([403, "PLAN_ENTITLEMENT_REQUIRED"]);
    const status = () =>
      (
        t.deps.sqlite.query("SELECT status FROM webhook_deliveries WHERE id = ?").get(delivery.id) as {
          status: string;
        }
      ).status;
    expect(status()).toBe("failed");
    t.workspace.setPlan("personal");
    expect((await replay()).status).toBe(200);
    expect(status()).toBe("pending");
  });
});

describe("the plan's webhook_endpoints allowance", () => {
  test("past it, creating an endpoint is 409 PLAN_QUOTA_EXCEEDED and stores nothing; a stopped one makes room; the plan report counts them", async () => {
    t.workspace.setPlan("personal");
    const ids: string[] = [];
    for (let i = 0; i < 10; i++) {
      const created = await create({ url: `https://receiver${i}.example.com/hook` });
      expect(created.status).toBe(201);
      ids.push(created.body.data.public_id);
    }
    const quota = async () => (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas.webhook_endpoints;
    expect(await quota()).toMatchObject({ limit: 10, used: 10, remaining: 0 });
    const before = storeDigest(t.deps.sqlite);
    const refused = await create({ url: "https://one-more.example.com/hook" });
    expect([refused.status, refused.body.error.code, refused.body.error.details]).toEqual([
      409,
      "PLAN_QUOTA_EXCEEDED",
      { quota: "webhook_endpoints", limit: 10, used: 10 },
    ]);
    expect(storeDigest(t.deps.sqlite)).toBe(before);

    expect((await t.call("DELETE", `/mgmt/v1/webhooks/${ids[0]}`)).status).toBe(204);
    expect(await quota()).toMatchObject({ used: 9, remaining: 1 });
    expect((await create({ url: "https://one-more.example.com/hook" })).status).toBe(201);
  });
});
