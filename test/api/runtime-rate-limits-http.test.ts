import { afterAll, beforeAll, expect, test } from "bun:test";
import type { RunningServer } from "../../src/server.ts";
import { createTestContext, serveTestStore, type TestContext } from "../support/harness.ts";

/**
 * The per-address runtime window through the real server on 127.0.0.1: the address is the socket's
 * peer, the window comes from configuration (as `npm run bench` sets it), and refusals show in
 * /metrics.
 */
const TOKEN = "metrics-token-for-rate-limits";
let t: TestContext;
let productId: string;

beforeAll(async () => {
  t = createTestContext();
  const product = await t.call("POST", "/mgmt/v1/products", {
    body: { name: "Limited", code: "limited", environment: "live" },
    headers: t.idem(),
  });
  productId = product.body.data.public_id;
});
afterAll(() => t.close());

const serve = (env: Record<string, string>): RunningServer =>
  serveTestStore(t, env, { "metrics-token": TOKEN });

const time = (server: RunningServer, headers: Record<string, string> = {}) =>
  fetch(`${server.url}/runtime/v1/time`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ product_id: productId, nonce: "a-time-nonce-of-enough-length" }),
  });

const rateLimited = async (server: RunningServer) => {
  const metrics = await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${TOKEN}` } });
  const line = (await metrics.text())
    .split("\n")
    .find((l) => l.startsWith('licensing_rate_limited_total{route="/runtime/v1/time"} '));
  return line ? Number(line.split(" ")[1]) : 0;
};

test("the configured per-address window refuses the socket peer's third call and counts it in /metrics", async () => {
  const server = serve({ LICENSING_RUNTIME_RATE_LIMIT_IP: "2/60" });
  try {
    expect((await time(server)).status).toBe(200);
    // Without --trust-forwarded-for a client cannot pick its own address.
    expect((await time(server, { "x-forwarded-for": "203.0.113.50" })).status).toBe(200);
    const refused = await time(server, { "x-forwarded-for": "203.0.113.51" });
    expect(refused.status).toBe(429);
    expect(refused.headers.get("retry-after")).toBe("30");
    expect(refused.headers.get("ratelimit-policy")).toBe('"runtime-ip";q=2;w=60');
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("RATE_LIMITED");
    expect(await rateLimited(server)).toBe(1);
  } finally {
    await server.shutdown("test done");
  }
});

test("with the per-address window off, a burst from one address is never refused", async () => {
  const server = serve({ LICENSING_RUNTIME_RATE_LIMIT_IP: "off" });
  try {
    const statuses = await Promise.all(Array.from({ length: 50 }, () => time(server).then((r) => r.status)));
    expect(statuses.filter((status) => status !== 200)).toEqual([]);
    expect(await rateLimited(server)).toBe(0);
  } finally {
    await server.shutdown("test done");
  }
});
