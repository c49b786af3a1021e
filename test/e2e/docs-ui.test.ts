import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { type Browser, chromium, type Locator, type Page } from "playwright-core";
import { BUILD_TIMEOUT_MS, removeTempDirs, type ServerProcess, startServe, tempDir } from "./binary.ts";

/**
 * The reference at /docs as a vendor's first look at it goes, in Debian's headless Chromium against
 * the compiled executable: opened at `localhost` though the base URL says 127.0.0.1, its "Try it
 * out" offers real request bodies and a working page size, and the calls reach the service.
 */
const CHROMIUM = process.env.LICENSING_TEST_CHROMIUM ?? "/usr/bin/chromium";

let server: ServerProcess;
let browser: Browser;
let testKey: string;

beforeAll(async () => {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `Chromium not found at ${CHROMIUM}: install Debian's package (apt-get install -y chromium), as .ci/run does, or set LICENSING_TEST_CHROMIUM`,
    );
  }
  server = await startServe(["--data-dir", join(tempDir("licensing-docs-ui-"), "data")]);
  const key = /test: (lsk_test_\S+)/.exec(server.stdout())?.[1];
  if (!key) throw new Error(`no test key printed:\n${server.stdout()}`);
  testKey = key;
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await browser?.close();
  await server?.stop("SIGKILL");
  removeTempDirs();
});

/** The operation's block, expanded and in "Try it out" mode. */
async function tryOut(page: Page, method: string, path: string): Promise<Locator> {
  const block = page.locator(`.opblock-${method}:has(.opblock-summary-path[data-path="${path}"])`).first();
  await block.locator(".opblock-summary").click();
  await block.locator("button.try-out__btn").click();
  return block;
}

test("the server's address opened at localhost leads to /docs, whose Try it out sends a real body and a valid page size to that same address", async () => {
  const context = await browser.newContext();
  const page = await context.newPage();
  const refused: string[] = [];
  page.on("console", (message) => {
    if (message.type() === "error") refused.push(message.text());
  });
  // Not the base URL's host: the document's server must follow the page, or CSP refuses the calls.
  const origin = `http://localhost:${server.port}`;
  await page.goto(`${origin}/`);
  expect(page.url()).toBe(`${origin}/docs`);
  await page.locator(".opblock").first().waitFor();

  const create = await tryOut(page, "post", "/mgmt/v1/products");
  const example = JSON.parse(await create.locator("textarea.body-param__text").inputValue());
  expect(typeof example).toBe("object");
  expect(Object.keys(example)).toEqual(expect.arrayContaining(["name", "code", "environment"]));

  await page.locator("button.authorize").first().click();
  const scheme = page.locator('.modal-ux .auth-container:has-text("managementApiKey")');
  await scheme.locator("input").fill(testKey);
  await scheme.locator("button.authorize").click();
  await page.locator(".modal-ux button.close-modal").click();

  const list = await tryOut(page, "get", "/mgmt/v1/products");
  expect(await list.locator('tr[data-param-name="limit"] input').inputValue()).toBe("50");
  const answered: { url: string; status: number }[] = [];
  page.on("response", (response) => answered.push({ url: response.url(), status: response.status() }));
  await list.locator("button.execute").click();
  // Swagger UI shows the call's outcome, a status or its failure to fetch, once it has one.
  const shown = await list.locator(".live-responses-table tbody .response-col_status").first().innerText();
  const requestUrl = new URL(await list.locator(".request-url pre").innerText());
  expect({
    shown: shown.trim(),
    origin: requestUrl.origin,
    limit: requestUrl.searchParams.get("limit"),
  }).toEqual({
    shown: "200",
    origin,
    limit: "50",
  });
  expect(answered.filter((r) => new URL(r.url).pathname === "/mgmt/v1/products")).toEqual([
    { url: `${origin}/mgmt/v1/products?limit=50`, status: 200 },
  ]);
  expect(refused.filter((text) => text.includes("Content Security Policy"))).toEqual([]);
  await context.close();
});
