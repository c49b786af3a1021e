import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import {
  api,
  BUILD_TIMEOUT_MS,
  executable,
  isListening,
  removeTempDirs,
  runCli,
  runServeToExit,
  type ServerProcess,
  startServe,
  tempDir,
} from "./binary.ts";

beforeAll(() => {
  executable();
}, BUILD_TIMEOUT_MS);

const running = new Set<ServerProcess>();
afterAll(async () => {
  for (const server of running) await server.stop("SIGKILL");
  removeTempDirs();
});

async function start(args: string[], options: Parameters<typeof startServe>[1] = {}): Promise<ServerProcess> {
  const server = await startServe(args, options);
  running.add(server);
  return server;
}

async function stop(server: ServerProcess, signal: NodeJS.Signals = "SIGTERM"): Promise<number> {
  running.delete(server);
  return server.stop(signal);
}

const keysIn = (stdout: string) => ({
  live: /live: (lsk_live_\w+)/.exec(stdout)?.[1] ?? "",
  test: /test: (lsk_test_\w+)/.exec(stdout)?.[1] ?? "",
});

/**
 * One data dir through a whole life: first start (init), real work over HTTP, CLI changes while it
 * runs, SIGTERM, and a restart that must find everything where it was. The tests run in order.
 */
describe("a server's life on one data dir", () => {
  let dataDir: string;
  let server: ServerProcess;
  let keys: { live: string; test: string };
  const created: Record<string, string> = {};

  test("init --json prepares the data dir, and serve starts on it without initialising again", async () => {
    dataDir = join(tempDir(), "data");
    const init = await runCli(["init", "--data-dir", dataDir, "--json"]);
    expect(init.exitCode).toBe(0);
    const output = JSON.parse(init.stdout) as { api_keys: { live: string; test: string }; data_dir: string };
    keys = output.api_keys;
    expect(keys.live).toMatch(/^lsk_live_[0-9A-Za-z]{32}$/);
    expect(keys.test).toMatch(/^lsk_test_[0-9A-Za-z]{32}$/);
    server = await start(["--data-dir", dataDir]);
    expect(server.stdout()).toContain(`listening on ${server.url}`);
    expect(keysIn(server.stdout()).live).toBe("");
    expect(server.logs().some((line) => line.msg === "data dir initialised")).toBe(false);
  });

  test("health and readiness answer over real HTTP", async () => {
    expect(await api(server.url, null, "GET", "/healthz")).toMatchObject({
      status: 200,
      body: { status: "ok" },
    });
    expect(await api(server.url, null, "GET", "/readyz")).toMatchObject({
      status: 200,
      body: { status: "ready" },
    });
  });

  test("a product is created and read back with the live key", async () => {
    const body = { name: "Desktop App", code: "desktop-app", environment: "live" };
    const product = await api(server.url, keys.live, "POST", "/mgmt/v1/products", body);
    expect(product.status).toBe(201);
    created.product = product.body.data.public_id;
    const read = await api(server.url, keys.live, "GET", `/mgmt/v1/products/${created.product}`);
    expect(read.body.data).toMatchObject({ public_id: created.product, code: "desktop-app" });
  });

  test("a policy, a customer and a license are created with the live key", async () => {
    expect(created.product).toBeDefined();
    const policy = await api(server.url, keys.live, "POST", "/mgmt/v1/policies", {
      product_id: created.product,
      name: "Standard",
    });
    expect(policy.status).toBe(201);
    created.policy = policy.body.data.public_id;
    const customer = await api(server.url, keys.live, "POST", "/mgmt/v1/customers", { name: "Acme Ltd" });
    expect(customer.status).toBe(201);
    created.customer = customer.body.data.public_id;
    const license = await api(server.url, keys.live, "POST", "/mgmt/v1/licenses", {
      product_id: created.product,
      policy_id: created.policy,
      customer_id: created.customer,
    });
    expect(license.status).toBe(201);
    expect(typeof license.body.data.key).toBe("string");
    created.license = license.body.data.public_id;
  });

  test("a key made with the CLI works while the server runs, and gets 401 once revoked", async () => {
    const made = await runCli([
      "keys",
      "create",
      "--data-dir",
      dataDir,
      "--env",
      "live",
      "--scopes",
      "products:read",
      "--json",
    ]);
    expect(made.exitCode).toBe(0);
    const { api_key: apiKey, id } = JSON.parse(made.stdout);
    // This process initialised the data dir itself before serving; it must still see the CLI's writes.
    expect((await api(server.url, apiKey, "GET", "/mgmt/v1/products")).status).toBe(200);
    expect((await api(server.url, apiKey, "POST", "/mgmt/v1/products", { name: "x" })).status).toBe(403);
    expect((await runCli(["keys", "revoke", id, "--data-dir", dataDir])).exitCode).toBe(0);
    const after = await api(server.url, apiKey, "GET", "/mgmt/v1/products");
    expect(after.status).toBe(401);
    expect(after.body.error.code).toBe("UNAUTHENTICATED");
  });

  test("plan set works while the server runs", async () => {
    expect((await runCli(["plan", "set", "business", "--data-dir", dataDir])).exitCode).toBe(0);
    expect((await runCli(["plan", "set", "self_hosted", "--data-dir", dataDir])).exitCode).toBe(0);
  });

  test("without --test-clock the test clock route does not exist", async () => {
    const response = await api(server.url, null, "POST", "/testing/v1/clock", { advance_sec: 60 });
    expect(response.status).toBe(404);
    expect(response.body.error.code).toBe("NOT_FOUND");
    expect(response.headers.get("x-service-test-clock")).toBeNull();
  });

  test("each request is one JSON log line with id, method, path, status and duration, and no secrets", async () => {
    const response = await api(server.url, keys.live, "GET", "/mgmt/v1/products?limit=5&cursor=x");
    const requestId = response.headers.get("x-request-id");
    const line = await server.logLine((entry) => entry.request_id === requestId);
    expect(line).toMatchObject({ level: "info", msg: "request", method: "GET", path: "/mgmt/v1/products" });
    expect(line?.status).toBe(response.status);
    expect(typeof line?.duration_ms).toBe("number");
    expect(server.stderr()).not.toContain(keys.live);
    expect(server.stderr()).not.toContain(keys.live.slice(9));
    expect(server.stderr()).not.toContain("cursor=x");
  });

  test("SIGTERM stops the server with exit code 0", async () => {
    expect(await stop(server)).toBe(0);
    expect(server.logs().some((line) => line.msg === "stopped")).toBe(true);
  });

  test("a restart keeps the data and neither re-initialises nor re-migrates", async () => {
    server = await start(["--data-dir", dataDir]);
    expect(server.stdout()).not.toContain("lsk_");
    expect(server.stdout()).not.toContain("Initialised");
    const ready = await server.logLine((line) => line.msg === "store ready");
    expect(ready?.applied).toEqual([]);
    const product = await api(server.url, keys.live, "GET", `/mgmt/v1/products/${created.product}`);
    expect(product.status).toBe(200);
    expect(product.body.data.name).toBe("Desktop App");
    const policy = await api(server.url, keys.live, "GET", `/mgmt/v1/policies/${created.policy}`);
    expect(policy.body.data).toMatchObject({ name: "Standard", product_id: created.product });
    const customer = await api(server.url, keys.live, "GET", `/mgmt/v1/customers/${created.customer}`);
    expect(customer.body.data.name).toBe("Acme Ltd");
    const license = await api(server.url, keys.live, "GET", `/mgmt/v1/licenses/${created.license}`);
    expect(license.body.data).toMatchObject({
      policy_id: created.policy,
      customer_id: created.customer,
      status: "active",
    });
    expect(await stop(server, "SIGINT")).toBe(0);
  });
});

describe("starting the executable elsewhere", () => {
  test("started in an empty directory it creates ./data, migrates and serves", async () => {
    const cwd = tempDir();
    const server = await start([], { cwd });
    expect(existsSync(join(cwd, "data", "licensing.db"))).toBe(true);
    const initialised = await server.logLine((line) => line.msg === "data dir initialised");
    expect((initialised?.migrations as string[] | undefined)?.length).toBeGreaterThan(0);
    const { live } = keysIn(server.stdout());
    expect((await api(server.url, live, "GET", "/mgmt/v1/products")).status).toBe(200);
    expect((await api(server.url, null, "GET", "/openapi.json")).body.openapi).toBe("3.1.0");
    expect((await api(server.url, null, "GET", "/docs/errors")).status).toBe(200);
    expect(await stop(server)).toBe(0);
  });

  test("a second server on a port that is in use exits 1 instead of sharing it", async () => {
    const first = await start(["--data-dir", join(tempDir(), "data")]);
    const second = await runServeToExit(["--data-dir", join(tempDir(), "data")], { port: first.port });
    expect(second.exitCode).toBe(1);
    expect(second.stderr).toContain(`cannot listen on 127.0.0.1:${first.port}`);
    expect(await stop(first)).toBe(0);
  });

  test("a second server on the same data dir exits 1 without serving; once the first dies, even by kill -9, a new one starts", async () => {
    const dataDir = join(tempDir(), "data");
    const first = await start(["--data-dir", dataDir]);
    const second = await runServeToExit(["--data-dir", dataDir]);
    expect(second.exitCode).toBe(1);
    expect(second.stderr).toContain(`another licensing serve is running on ${dataDir}`);
    expect(await isListening(second.port)).toBe(false);
    expect((await api(first.url, null, "GET", "/readyz")).status).toBe(200);
    // The operating system lets go of the lock with the process, however it ends.
    expect(await stop(first, "SIGKILL")).not.toBe(0);
    const third = await start(["--data-dir", dataDir]);
    expect((await api(third.url, null, "GET", "/readyz")).status).toBe(200);
    expect(await stop(third)).toBe(0);
  });

  test("the base URL flag sets doc_url in error bodies", async () => {
    const server = await start([
      "--data-dir",
      join(tempDir(), "data"),
      "--base-url",
      "https://lic.example.com/",
    ]);
    const response = await api(server.url, null, "GET", "/mgmt/v1/products");
    expect(response.body.error.doc_url).toBe("https://lic.example.com/docs/errors#UNAUTHENTICATED");
    expect(await stop(server)).toBe(0);
  });
});

describe("with --test-clock", () => {
  let server: ServerProcess;
  beforeAll(async () => {
    server = await start(["--data-dir", join(tempDir(), "data"), "--test-clock"]);
  });

  test("the server warns at start-up and marks every response", async () => {
    expect(
      server.logs().some((line) => line.level === "warn" && String(line.msg).includes("test clock")),
    ).toBe(true);
    expect((await api(server.url, null, "GET", "/healthz")).headers.get("x-service-test-clock")).toBe("1");
  });

  test("POST /testing/v1/clock moves time forward and answers the new Unix time", async () => {
    const before = Math.floor(Date.now() / 1000);
    const response = await api(server.url, null, "POST", "/testing/v1/clock", { advance_sec: 86_400 });
    expect(response.status).toBe(200);
    expect(Object.keys(response.body)).toEqual(["data"]);
    expect(response.body.data.now).toBeGreaterThanOrEqual(before + 86_400);
    expect(response.body.data.now).toBeLessThan(before + 86_400 + 60);
    const again = await api(server.url, null, "POST", "/testing/v1/clock", { advance_sec: 0 });
    expect(again.body.data.now).toBeGreaterThanOrEqual(response.body.data.now);
  });

  test.each([
    [{ advance_sec: -1 }],
    [{ advance_sec: 1.5 }],
    [{ advance_sec: "60" }],
    [{ advance_sec: 1, x: 2 }],
    [{}],
  ])("advance_sec must be a non-negative integer: %p is refused with 422", async (body) => {
    const response = await api(server.url, null, "POST", "/testing/v1/clock", body);
    expect(response.status).toBe(422);
    expect(response.body.error.code).toBe("VALIDATION_FAILED");
  });

  test("SIGTERM waits for a request still in flight before exiting 0", async () => {
    const { live } = keysIn(server.stdout());
    const encoder = new TextEncoder();
    let send: (text: string) => void = () => {};
    let finish: () => void = () => {};
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        send = (text) => controller.enqueue(encoder.encode(text));
        finish = () => controller.close();
      },
    });
    const pending = fetch(`${server.url}/mgmt/v1/products`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${live}`,
        "content-type": "application/json",
        "idempotency-key": "e2e-drain-request-0001",
      },
      body,
      // @ts-expect-error Bun's fetch needs duplex for a streamed body; DOM typings lack it.
      duplex: "half",
    });
    send('{"name":"Slow upload",');
    // Long enough for a loaded machine to have the request in the server before the SIGTERM.
    await Bun.sleep(1_000);
    server.proc.kill("SIGTERM");
    await Bun.sleep(300);
    expect(server.proc.exitCode).toBeNull();
    send('"code":"slow-upload","environment":"live"}');
    finish();
    const response = await pending;
    expect(response.status).toBe(201);
    running.delete(server);
    expect(await server.proc.exited).toBe(0);
  });
});
