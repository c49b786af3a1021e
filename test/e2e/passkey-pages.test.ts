import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { type Browser, chromium } from "playwright-core";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * The passkey pages in Debian's headless Chromium, under their real Content-Security-Policy: the
 * browser fetches them from the app (no executable to build), so what runs is exactly what is
 * served. A link whose fragment a mail program mangled must say so, not leave a dead button.
 */
const CHROMIUM = process.env.LICENSING_TEST_CHROMIUM ?? "/usr/bin/chromium";
// localhost is a secure context, so the browser offers WebAuthn there.
const ORIGIN = "http://localhost:18999";

let t: TestContext;
let browser: Browser;

beforeAll(async () => {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `Chromium not found at ${CHROMIUM}: install Debian's package (apt-get install -y chromium), as .ci/run does, or set LICENSING_TEST_CHROMIUM`,
    );
  }
  t = createTestContext();
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox"] });
});

afterAll(async () => {
  await browser?.close();
  t?.close();
});

/** Opens the page at `path` + `hash`, served by the app; returns what it shows and any script errors. */
async function opened(path: string, hash: string, origin = ORIGIN) {
  const context = await browser.newContext();
  const page = await context.newPage();
  const errors: string[] = [];
  page.on("pageerror", (error) => errors.push(error.message));
  page.on("console", (message) => {
    if (message.type() === "error") errors.push(message.text());
  });
  await page.route(`${origin}/**`, async (route) => {
    const url = new URL(route.request().url());
    const answer = await t.call(route.request().method(), url.pathname, { key: null });
    await route.fulfill({
      status: answer.status,
      headers: Object.fromEntries(answer.headers.entries()),
      body: answer.text,
    });
  });
  await page.goto(`${origin}${path}${hash}`);
  const state = await page.evaluate(() => ({
    out: document.getElementById("out")?.textContent ?? "",
    hidden: (document.getElementById("go") as HTMLButtonElement).hidden,
  }));
  await context.close();
  return { ...state, errors };
}

test.each([
  ["/passkeys/v1/register", "#abc%E0%A4%A"],
  ["/passkeys/v1/register", "#%"],
  ["/passkeys/v1/approve", "#ver_abc.x%"],
])(
  "%s with the malformed fragment %s says the link is incomplete and hides its button, with no script error",
  async (path, hash) => {
    expect(await opened(path, hash)).toEqual({
      out: "This link is incomplete. Open the link you were sent, whole.",
      hidden: true,
      errors: [],
    });
  },
);

test.each([
  ["/passkeys/v1/register", "#token"],
  ["/passkeys/v1/approve", "#ver_abc.secret"],
])("%s with a whole link runs under its CSP and offers its button", async (path, hash) => {
  expect(await opened(path, hash)).toEqual({ out: "", hidden: false, errors: [] });
});

test.each([
  ["/passkeys/v1/register", "#token"],
  ["/passkeys/v1/approve", "#ver_abc.secret"],
])(
  "%s opened over plain http on another host than localhost says it needs a secure page, not that the browser lacks passkeys",
  async (path, hash) => {
    expect(await opened(path, hash, "http://licensing.example:18999")).toEqual({
      out: "Passkeys need a secure page (https://), and this one was opened over plain http. Ask for a link that starts with https://.",
      hidden: true,
      errors: [],
    });
  },
);
