import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { resolveConfig } from "../../src/config.ts";
import { silentLogger } from "../../src/http/logger.ts";
import { Metrics, routeMatcher } from "../../src/http/metrics.ts";
import { type RunningServer, startServer } from "../../src/server.ts";
import { freshNonce } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * GET /metrics through the real server (startServer on a free port), because requests are counted
 * where the final response is known: in the server's request handler, as they are logged.
 */
const TOKEN = "metrics-token-for-tests-0123";
let t: TestContext;
let server: RunningServer;

beforeAll(() => {
  t = createTestContext();
  const config = { ...resolveConfig({ "data-dir": t.dir, "metrics-token": TOKEN }, {}, t.dir), port: 0 };
  server = startServer({ config, passphrase: "test passphrase", logger: silentLogger });
});
afterAll(async () => {
  await server.shutdown("test done");
  t.close();
});

async function http(
  method: string,
  path: string,
  options: { key?: string | null; body?: unknown; headers?: Record<string, string> } = {},
) {
  const headers: Record<string, string> = { ...options.headers };
  const key = options.key === undefined ? t.keys.live : options.key;
  if (key !== null) headers.authorization = `Bearer ${key}`;
  if (options.body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  return { status: response.status, headers: response.headers, text: await response.text() };
}

async function scrape(): Promise<string> {
  const response = await http("GET", "/metrics", { key: TOKEN });
  expect(response.status).toBe(200);
  return response.text;
}

/** The value of one sample line, by its exact name and labels; 0 when absent. */
function sample(text: string, series: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line ? Number(line.slice(series.length + 1)) : 0;
}

describe("GET /metrics", () => {
  test("without the token answers 401 in the error envelope, and a management key is not the token", async () => {
    for (const key of [null, t.keys.live, `${TOKEN}x`]) {
      const response = await http("GET", "/metrics", { key });
      expect(response.status).toBe(401);
      const body = JSON.parse(response.text);
      expect(body.error.code).toBe("UNAUTHENTICATED");
      expect(body.error.request_id).toBe(response.headers.get("x-request-id"));
      expect(response.headers.get("www-authenticate")).toBe('Bearer realm="metrics"');
    }
  });

  test("the token is taken whatever the case of the Bearer scheme, and after several spaces; another scheme is not", async () => {
    const withHeader = (authorization: string) =>
      http("GET", "/metrics", { key: null, headers: { authorization } });
    for (const authorization of [`bearer ${TOKEN}`, `BEARER ${TOKEN}`, `bEaReR  ${TOKEN}`]) {
      expect({ authorization, status: (await withHeader(authorization)).status }).toEqual({
        authorization,
        status: 200,
      });
    }
    for (const authorization of [
      `Basic ${TOKEN}`,
      `Bearer${TOKEN}`,
      `Bearer\t${TOKEN}`,
      `Bearer ${TOKEN} x`,
    ]) {
      expect({ authorization, status: (await withHeader(authorization)).status }).toEqual({
        authorization,
        status: 401,
      });
    }
  });

  test("answers the Prometheus text format, every sample line well-formed", async () => {
    const response = await http("GET", "/metrics", { key: TOKEN });
    expect(response.headers.get("content-type")).toBe("text/plain; version=0.0.4; charset=utf-8");
    for (const line of response.text.trimEnd().split("\n")) {
      expect(line).toMatch(
        /^(# (HELP|TYPE) [a-z_]+ .+|[a-z_]+(\{[a-z_]+="[^"\n]*"(,[a-z_]+="[^"\n]*")*\})? -?[0-9.e+-]+)$/,
      );
    }
    expect(response.text).toContain("# TYPE licensing_http_request_duration_seconds histogram");
    expect(response.text).toContain('licensing_build_info{version="0.1.0"} 1');
  });

  test("counts requests by route template and status, never by raw path", async () => {
    const before = await scrape();
    const missing = "/mgmt/v1/products/prod_01M81Z00000000000000000000";
    const notFound = 'licensing_http_requests_total{method="GET",route="/mgmt/v1/products/:id",status="404"}';
    const listed = 'licensing_http_requests_total{method="GET",route="/mgmt/v1/products",status="200"}';
    const unmatched = 'licensing_http_requests_total{method="GET",route="unmatched",status="404"}';
    await http("GET", missing);
    await http("GET", missing);
    await http("GET", "/mgmt/v1/products");
    await http("GET", "/no/such/route/secret-looking-path");
    const after = await scrape();
    expect(sample(after, notFound) - sample(before, notFound)).toBe(2);
    expect(sample(after, listed) - sample(before, listed)).toBe(1);
    expect(sample(after, unmatched) - sample(before, unmatched)).toBe(1);
    expect(after).not.toContain("prod_01M81Z");
    expect(after).not.toContain("secret-looking-path");
  });

  test("a served path counts under its route and real method: trailing slash, HEAD, preflight", async () => {
    const before = await scrape();
    const series = (method: string, route: string, status: number) =>
      `licensing_http_requests_total{method="${method}",route="${route}",status="${status}"}`;
    const docs = series("GET", "/docs", 200);
    const errors = series("GET", "/docs/errors", 200);
    const head = series("HEAD", "/healthz", 200);
    expect((await http("GET", "/docs/", { key: null })).status).toBe(200);
    expect((await http("GET", "/docs/errors/", { key: null })).status).toBe(200);
    expect((await http("HEAD", "/healthz", { key: null })).status).toBe(200);
    const preflight = await http("OPTIONS", "/runtime/v1/time", {
      key: null,
      headers: { origin: "https://app.example.com", "access-control-request-method": "POST" },
    });
    const options = series("OPTIONS", "/runtime/v1/time", preflight.status);
    const after = await scrape();
    expect(sample(after, docs) - sample(before, docs)).toBe(1);
    expect(sample(after, errors) - sample(before, errors)).toBe(1);
    expect(sample(after, head) - sample(before, head)).toBe(1);
    expect(sample(after, options) - sample(before, options)).toBe(1);
  });

  test("the latency histogram is cumulative and its count matches the requests", async () => {
    for (let i = 0; i < 3; i++) await http("GET", "/healthz", { key: null });
    const text = await scrape();
    const series = '{method="GET",route="/healthz"}';
    const buckets = text
      .split("\n")
      .filter((l) =>
        l.startsWith('licensing_http_request_duration_seconds_bucket{method="GET",route="/healthz",'),
      )
      .map((l) => Number(l.split(" ")[1]));
    expect(buckets.length).toBeGreaterThan(2);
    for (let i = 1; i < buckets.length; i++)
      expect(buckets[i]).toBeGreaterThanOrEqual(buckets[i - 1] as number);
    const count = sample(text, `licensing_http_request_duration_seconds_count${series}`);
    expect(buckets.at(-1)).toBe(count);
    expect(count).toBe(
      sample(text, 'licensing_http_requests_total{method="GET",route="/healthz",status="200"}'),
    );
    expect(sample(text, `licensing_http_request_duration_seconds_sum${series}`)).toBeGreaterThan(0);
  });

  test("counts idempotent replays and rate-limit refusals", async () => {
    const before = await scrape();
    const headers = { "idempotency-key": "metrics-replay-key-0001" };
    const body = { name: "Replayed", code: "replayed", environment: "live" };
    expect((await http("POST", "/mgmt/v1/products", { body, headers })).status).toBe(201);
    const replay = await http("POST", "/mgmt/v1/products", { body, headers });
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    // A fresh key, so the limit (100 per second, bursts of 100) is not shared with other tests.
    const key = t.keyFor("live");
    const statuses = await Promise.all(
      // Well past the burst: the bucket refills one every 10 ms, so a slow machine needs margin.
      Array.from({ length: 400 }, () => http("GET", "/mgmt/v1/plan", { key }).then((r) => r.status)),
    );
    const refused = statuses.filter((status) => status === 429).length;
    expect(refused).toBeGreaterThan(0);
    const after = await scrape();
    const replays = 'licensing_idempotency_replays_total{route="/mgmt/v1/products"}';
    const limited = 'licensing_rate_limited_total{route="/mgmt/v1/plan"}';
    expect(sample(after, replays) - sample(before, replays)).toBe(1);
    expect(sample(after, limited) - sample(before, limited)).toBe(refused);
  });

  test("counts signatures: a signed time answer adds at least one", async () => {
    const product = await http("POST", "/mgmt/v1/products", {
      body: { name: "Signed", code: "signed", environment: "live" },
      headers: t.idem(),
    });
    const productId = JSON.parse(product.text).data.public_id;
    const before = sample(await scrape(), "licensing_signatures_total");
    const time = await http("POST", "/runtime/v1/time", {
      key: null,
      body: { product_id: productId, nonce: freshNonce() },
    });
    expect(time.status).toBe(200);
    expect(sample(await scrape(), "licensing_signatures_total")).toBeGreaterThan(before);
  });

  test("reports the store size", async () => {
    const text = await scrape();
    const pageSize = t.deps.sqlite.query<{ page_size: number }, []>("PRAGMA page_size").get()?.page_size ?? 0;
    expect(sample(text, "licensing_store_size_bytes")).toBeGreaterThan(0);
    expect(sample(text, "licensing_store_size_bytes") % pageSize).toBe(0);
  });
});

test("a made-up method is labelled OTHER, so the method label set stays closed", () => {
  // Bun's server hands such a request over as a GET, so this is checked on the registry itself.
  const metrics = new Metrics({ version: "0" }, routeMatcher([{ method: "GET", path: "/healthz" }]));
  const response = new Response(null, { status: 404 });
  metrics.observe("BREW", "/healthz", response, 0.001);
  metrics.observe("GET", "/no/such/route", response, 0.001);
  const text = metrics.render();
  expect(text).toContain('licensing_http_requests_total{method="OTHER",route="unmatched",status="404"} 1');
  expect(text).toContain('licensing_http_requests_total{method="GET",route="unmatched",status="404"} 1');
  expect(text).not.toContain("BREW");
});

test("without a metrics token the route does not exist", async () => {
  const response = await t.call("GET", "/metrics", { key: null });
  expect(response.status).toBe(404);
  expect(response.body.error.code).toBe("NOT_FOUND");
});
