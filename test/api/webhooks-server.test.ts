import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Server } from "bun";
import { Webhook } from "standardwebhooks";
import { resolveConfig } from "../../src/config.ts";
import { jsonLogger } from "../../src/http/logger.ts";
import { type RunningServer, startServer } from "../../src/server.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * The dispatcher as `licensing serve` runs it (startServer on a free port): started with the
 * server, delivering at once on a new event, counted in /metrics, and stopped on shutdown.
 */
const TOKEN = "metrics-token-for-webhooks-01";
let t: TestContext;
let server: RunningServer;
let receiver: Server<undefined>;
let status = 500;
const received: { body: string; headers: Record<string, string> }[] = [];
const lines: string[] = [];
let sent = 1000;

beforeAll(() => {
  t = createTestContext();
  receiver = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch: async (request) => {
      received.push({ body: await request.text(), headers: Object.fromEntries(request.headers.entries()) });
      return new Response(null, { status });
    },
  });
  const config = {
    ...resolveConfig(
      { "data-dir": t.dir, "metrics-token": TOKEN, "webhook-allow-private-networks": true },
      {},
      t.dir,
    ),
    port: 0,
  };
  server = startServer({
    config,
    passphrase: "test passphrase",
    logger: jsonLogger("debug", (line) => lines.push(line) > 0),
  });
});
afterAll(async () => {
  await server.shutdown("test done");
  receiver.stop(true);
  t.close();
});

async function http(method: string, path: string, body?: unknown, key = t.keys.live) {
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${key}`,
      ...(body ? { "content-type": "application/json", "idempotency-key": `webhooks-server-${++sent}` } : {}),
    },
    body: body ? JSON.stringify(body) : undefined,
  });
  return { status: response.status, text: await response.text() };
}

const sample = (text: string, name: string) =>
  Number(
    text
      .split("\n")
      .find((l) => l.startsWith(`${name} `))
      ?.slice(name.length + 1) ?? Number.NaN,
  );

async function until(condition: () => boolean, ms = 5_000) {
  const deadline = Date.now() + ms;
  while (!condition() && Date.now() < deadline) await Bun.sleep(10);
  expect(condition()).toBe(true);
}

test("serve delivers a new event at once, counts failures and the queue in /metrics, and never logs the secret", async () => {
  const created = await http("POST", "/mgmt/v1/webhooks", {
    url: `http://127.0.0.1:${receiver.port}/hook`,
    events: ["customer.created"],
  });
  expect(created.status).toBe(201);
  const secret = JSON.parse(created.text).data.secret as string;

  expect((await http("POST", "/mgmt/v1/customers", { name: "Ada" })).status).toBe(201);
  await until(() => received.length === 1);
  new Webhook(secret).verify(received[0]?.body as string, received[0]?.headers as Record<string, string>);
  // The receiver has the request before the dispatcher has its answer: the attempt is counted
  // once it is recorded, which the log line follows.
  await until(() => lines.some((line) => line.includes('"webhook attempt failed"')));

  const metrics = await http("GET", "/metrics", undefined, TOKEN);
  expect(metrics.status).toBe(200);
  expect(metrics.text).toContain("# TYPE licensing_webhook_queue_depth gauge");
  // The 500 leaves it queued for its first retry, 5 s later.
  expect(sample(metrics.text, "licensing_webhook_queue_depth")).toBe(1);
  expect(sample(metrics.text, "licensing_webhook_attempts_total")).toBe(1);
  expect(sample(metrics.text, "licensing_webhook_failures_total")).toBe(1);

  status = 204;
  await until(() => received.length === 2, 10_000);
  // The receiver has answered; the attempt is recorded just after.
  let after = await http("GET", "/metrics", undefined, TOKEN);
  for (let i = 0; i < 100 && sample(after.text, "licensing_webhook_queue_depth") !== 0; i++) {
    await Bun.sleep(20);
    after = await http("GET", "/metrics", undefined, TOKEN);
  }
  expect(sample(after.text, "licensing_webhook_queue_depth")).toBe(0);
  expect(sample(after.text, "licensing_webhook_attempts_total")).toBe(2);
  expect(sample(after.text, "licensing_webhook_failures_total")).toBe(1);
  const log = lines.join("\n");
  expect(log).not.toContain(secret);
  expect(log).not.toContain(secret.slice(6));
}, 20_000);
