import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import type { Server } from "bun";
import { type Browser, chromium, type Page } from "playwright-core";
import { bundleBrowserSdk } from "../../build/sdk-browser.ts";
import {
  api,
  BUILD_TIMEOUT_MS,
  freePort,
  initialisedDataDir,
  removeTempDirs,
  runCli,
  type ServerProcess,
  startServe,
} from "./binary.ts";

/**
 * The SDK in a real browser (Debian's headless Chromium, driven by playwright-core) against the
 * compiled executable: a page on an origin the product allows activates a device; a page on
 * another origin is stopped by the browser's own CORS check and changes nothing on the server.
 */
const CHROMIUM = process.env.LICENSING_TEST_CHROMIUM ?? "/usr/bin/chromium";

let server: ServerProcess;
let browser: Browser;
let testKey: string;
let sdkBundle: string;
const pageServers: Server<undefined>[] = [];

beforeAll(async () => {
  // Never skipped: a machine without Chromium fails here, saying what to install.
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `Chromium not found at ${CHROMIUM}: install Debian's package (apt-get install -y chromium), as .ci/run does, or set LICENSING_TEST_CHROMIUM`,
    );
  }
  // The bundle `npm run build:sdk` ships: the page proves its Web Crypto stand-in for Node's works.
  sdkBundle = await (await bundleBrowserSdk()).text();

  const { dataDir } = await initialisedDataDir();
  const created = await runCli([
    "keys",
    "create",
    "--data-dir",
    dataDir,
    "--env",
    "test",
    "--scopes",
    "all",
    "--json",
  ]);
  if (created.exitCode !== 0) throw new Error(`keys create failed: ${created.stderr}`);
  testKey = (JSON.parse(created.stdout) as { api_key: string }).api_key;
  const port = await freePort();
  server = await startServe(["--data-dir", dataDir, "--base-url", `http://127.0.0.1:${port}`], { port });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    // CI runs as root, where Chromium's sandbox cannot start.
    args: ["--no-sandbox"],
  });
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await browser?.close();
  for (const pages of pageServers) await pages.stop(true);
  await server?.stop("SIGKILL");
  removeTempDirs();
});

/** The vendor's web app: one HTML page that imports the SDK bundle as an ES module. */
function servePages(): number {
  const html = `<!doctype html><meta charset="utf-8"><title>app</title>
<script type="module">import * as sdk from "/sdk.js"; globalThis.sdk = sdk; globalThis.sdkReady = true;</script>`;
  const pages = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch(request) {
      const path = new URL(request.url).pathname;
      if (path === "/sdk.js")
        return new Response(sdkBundle, { headers: { "content-type": "text/javascript" } });
      if (path === "/") return new Response(html, { headers: { "content-type": "text/html" } });
      return new Response("not found", { status: 404 });
    },
  });
  pageServers.push(pages);
  if (pages.port === undefined) throw new Error("the page server has no port");
  return pages.port;
}

type Outcome =
  | { ok: true; activationId: string; state: string }
  | { ok: false; code: string; message: string };

/** Opens `url` in a fresh browser context and activates through the SDK there, as the app would. */
async function activateFrom(url: string, config: unknown, licenseKey: string) {
  const context = await browser.newContext();
  const page: Page = await context.newPage();
  const console: string[] = [];
  page.on("console", (message) => console.push(message.text()));
  await page.goto(url);
  await page.waitForFunction(() => (globalThis as { sdkReady?: boolean }).sdkReady === true);
  const outcome = await page.evaluate(
    async ({ config, licenseKey }): Promise<Outcome> => {
      const sdk = (globalThis as unknown as { sdk: typeof import("../../src/sdk/index.ts") }).sdk;
      const client = new sdk.LicensingClient({
        config: config as never,
        storage: new sdk.LocalStorageAdapter(localStorage),
        appVersion: "1.0.0",
      });
      try {
        const result = await client.activate({ licenseKey, machineInfo: { os: "linux", arch: "x64" } });
        return { ok: true, activationId: result.activationId, state: await client.licenseState() };
      } catch (error) {
        const e = error as { code?: string; message?: string };
        return { ok: false, code: e.code ?? "unknown", message: e.message ?? String(error) };
      }
    },
    { config, licenseKey },
  );
  await context.close();
  return { outcome, console };
}

test("a page on an allowed origin activates through the SDK; a page on another origin is refused by the browser", async () => {
  const allowedPort = servePages();
  const otherPort = servePages();
  // Two origins on the same loopback host: they differ by host name and port, as two sites do.
  const allowedOrigin = `http://127.0.0.1:${allowedPort}`;
  const otherOrigin = `http://localhost:${otherPort}`;

  const product = await api(server.url, testKey, "POST", "/mgmt/v1/products", {
    name: "Web app",
    code: "web-app",
    environment: "test",
  });
  expect(product.status).toBe(201);
  const productId = product.body.data.public_id as string;
  const policy = await api(server.url, testKey, "POST", "/mgmt/v1/policies", {
    product_id: productId,
    name: "Std",
    max_machines: 5,
  });
  const license = await api(server.url, testKey, "POST", "/mgmt/v1/licenses", {
    product_id: productId,
    policy_id: policy.body.data.public_id,
  });
  expect(license.status).toBe(201);
  const settings = await api(server.url, testKey, "PATCH", `/mgmt/v1/products/${productId}/browser-runtime`, {
    enabled: true,
    allowed_origins: [allowedOrigin],
  });
  expect(settings.status).toBe(200);
  const config = (await api(server.url, testKey, "GET", `/mgmt/v1/products/${productId}/integration-config`))
    .body.data.config;
  const licenseKey = license.body.data.key as string;

  const allowed = await activateFrom(`${allowedOrigin}/`, config, licenseKey);
  expect(allowed.outcome).toMatchObject({ ok: true, state: "valid" });

  const refused = await activateFrom(`${otherOrigin}/`, config, licenseKey);
  expect(refused.outcome).toMatchObject({ ok: false, code: "NETWORK_ERROR" });
  // The browser says why: its CORS check, naming the refused origin.
  expect(refused.console.some((line) => line.includes("CORS policy") && line.includes(otherOrigin))).toBe(
    true,
  );

  const activations = await api(
    server.url,
    testKey,
    "GET",
    `/mgmt/v1/licenses/${license.body.data.public_id}/activations`,
  );
  expect(activations.body.data).toHaveLength(1);
  if (allowed.outcome.ok) expect(activations.body.data[0].id).toBe(allowed.outcome.activationId);
}, 60_000);

type TabOutcome = { code: string; activationId: string | null; signingKey: string };

test("two tabs opened at once on IndexedDbStorage make one key pair and one activation, every time", async () => {
  const origin = `http://127.0.0.1:${servePages()}`;
  const product = await api(server.url, testKey, "POST", "/mgmt/v1/products", {
    name: "Tabs",
    code: "tabs",
    environment: "test",
  });
  const productId = product.body.data.public_id as string;
  // One machine: a second key pair would take the only slot, or be refused one.
  const policy = await api(server.url, testKey, "POST", "/mgmt/v1/policies", {
    product_id: productId,
    name: "One machine",
    max_machines: 1,
  });
  await api(server.url, testKey, "PATCH", `/mgmt/v1/products/${productId}/browser-runtime`, {
    enabled: true,
    allowed_origins: [origin],
  });
  const config = (await api(server.url, testKey, "GET", `/mgmt/v1/products/${productId}/integration-config`))
    .body.data.config;
  const context = await browser.newContext();
  const tabs = [await context.newPage(), await context.newPage()];
  for (const tab of tabs) {
    await tab.goto(`${origin}/`);
    await tab.waitForFunction(() => (globalThis as { sdkReady?: boolean }).sdkReady === true);
  }
  // Localstorage lost this race about one first run in ten (docs/sdk.md): ten runs, each a new device.
  for (let run = 0; run < 10; run++) {
    const license = await api(server.url, testKey, "POST", "/mgmt/v1/licenses", {
      product_id: productId,
      policy_id: policy.body.data.public_id,
    });
    const licenseKey = license.body.data.key as string;
    const outcomes = await Promise.all(
      tabs.map((tab) =>
        tab.evaluate(
          async ({ config, licenseKey, name }): Promise<TabOutcome> => {
            const sdk = (globalThis as unknown as { sdk: typeof import("../../src/sdk/index.ts") }).sdk;
            const client = new sdk.LicensingClient({
              config: config as never,
              storage: await sdk.IndexedDbStorage.open({ name }),
              appVersion: "1.0.0",
            });
            let code = "ok";
            try {
              await client.activate({ licenseKey, machineInfo: { os: "linux", arch: "x64" } });
            } catch (error) {
              code = (error as { code?: string }).code ?? String(error);
            }
            return {
              code,
              activationId: (await client.activationId()) ?? null,
              signingKey: (await client.deviceKeys()).signing.publicKey,
            };
          },
          { config, licenseKey, name: `first-run-${run}` },
        ),
      ),
    );
    const [a, b] = outcomes as [TabOutcome, TabOutcome];
    // A tab that asked after the other stored the activation is told so; nothing else may fail.
    expect([a.code, b.code].every((code) => code === "ok" || code === "ALREADY_ACTIVATED")).toBe(true);
    expect(a.signingKey).toBe(b.signingKey);
    expect(a.activationId).not.toBeNull();
    expect(b.activationId).toBe(a.activationId);
    const held = await api(
      server.url,
      testKey,
      "GET",
      `/mgmt/v1/licenses/${license.body.data.public_id}/activations`,
    );
    expect(held.body.data.map((activation: { id: string }) => activation.id)).toEqual([a.activationId]);
  }
  await context.close();
}, 120_000);
