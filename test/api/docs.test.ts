import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ERROR_CODES } from "../../src/http/errors.ts";
import { withoutDocumentLinks } from "../../src/modules/docs/index.ts";
import { BASE_URL, type CallResult, createTestContext, type TestContext } from "../support/harness.ts";

let t: TestContext;

beforeAll(() => {
  t = createTestContext();
});

afterAll(() => t.close());

const attributeValues = (html: string, tag: string, attribute: string): string[] =>
  [...html.matchAll(new RegExp(`<${tag}\\b[^>]*\\b${attribute}\\s*=\\s*["']([^"']*)["']`, "gi"))].map(
    (m) => m[1] as string,
  );

const ENVELOPE_FIELDS = ["code", "details", "doc_url", "message", "request_id", "retryable"];

const expectEnvelope = (response: CallResult, code: keyof typeof ERROR_CODES) => {
  expect(response.status).toBe(ERROR_CODES[code].status);
  expect(response.headers.get("content-type")).toContain("application/json");
  const error = response.body?.error;
  expect(Object.keys(error ?? {}).sort()).toEqual(ENVELOPE_FIELDS);
  expect(error.code).toBe(code);
  expect(typeof error.message).toBe("string");
  expect(error.message.length).toBeGreaterThan(0);
  expect(error.retryable).toBe(ERROR_CODES[code].retryable);
  expect(error.details).toEqual(expect.any(Object));
  expect(error.request_id).toMatch(/^req_[0-9A-HJKMNP-TV-Z]{26}$/);
  expect(error.request_id).toBe(response.headers.get("x-request-id"));
  expect(error.doc_url).toBe(`${BASE_URL}/docs/errors#${code}`);
};

describe("the documentation pages' Content-Security-Policy", () => {
  const directives = (policy: string | null) =>
    new Map(
      (policy ?? "")
        .split(";")
        .map((d) => d.trim().split(/\s+/))
        .map(([name, ...values]) => [name, values]),
    );

  test("/docs runs its own assets and its one inline script, by hash; no page may frame it", async () => {
    const response = await t.call("GET", "/docs", { key: null });
    const inline = [...response.text.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1] as string);
    expect(inline.length).toBe(1);
    const hash = createHash("sha256")
      .update(inline[0] as string)
      .digest("base64");
    const policy = directives(response.headers.get("content-security-policy"));
    expect(policy.get("script-src")).toEqual(["'self'", `'sha256-${hash}'`]);
    expect(policy.get("frame-ancestors")).toEqual(["'none'"]);
  });

  test("/docs/errors runs no script and no page may frame it", async () => {
    const response = await t.call("GET", "/docs/errors", { key: null });
    expect(response.text).not.toContain("<script");
    const policy = directives(response.headers.get("content-security-policy"));
    expect(policy.get("script-src")).toEqual(["'none'"]);
    expect(policy.get("frame-ancestors")).toEqual(["'none'"]);
  });
});

describe("GET /docs", () => {
  test("answers an HTML page without an API key", async () => {
    const response = await t.call("GET", "/docs", { key: null });
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toContain("text/html");
    expect(response.text.toLowerCase()).toContain("<!doctype html>");
  });

  test("references no absolute or protocol-relative URL anywhere in the page", async () => {
    const { text } = await t.call("GET", "/docs", { key: null });
    expect(text).not.toMatch(/https?:\/\//i);
    expect(text).not.toMatch(/["'(=\s]\/\//);
  });

  test("loads its scripts and stylesheets by paths relative to the page", async () => {
    const { text } = await t.call("GET", "/docs", { key: null });
    const scripts = attributeValues(text, "script", "src");
    const links = attributeValues(text, "link", "href");
    expect(scripts.length).toBeGreaterThan(0);
    expect(links.length).toBeGreaterThan(0);
    for (const url of [...scripts, ...links]) {
      expect(url).toMatch(/^docs\/assets\/[\w.-]+$/);
    }
  });

  /** Every URL the page loads or calls: its scripts, stylesheets and the OpenAPI document. */
  const pageUrls = (text: string) => [
    ...attributeValues(text, "script", "src"),
    ...attributeValues(text, "link", "href"),
    ...[...text.matchAll(/url: "([^"]+)"/g)].map((m) => m[1] as string),
  ];

  test("behind a proxy that serves the service under a path prefix, everything the page uses stays under it and is served", async () => {
    const { text } = await t.call("GET", "/docs", { key: null });
    const urls = pageUrls(text);
    expect(urls).toHaveLength(3);
    for (const url of urls) {
      const resolved = new URL(url, "https://proxy.example/licensing/docs").pathname;
      expect(resolved).toStartWith("/licensing/");
      // What the proxy forwards once it has stripped its prefix.
      const forwarded = await t.call("GET", resolved.slice("/licensing".length), { key: null });
      expect(`${resolved} ${forwarded.status}`).toBe(`${resolved} 200`);
    }
  });

  test("/docs/ is sent to /docs by a relative 308, where the page's relative URLs resolve", async () => {
    const response = await t.call("GET", "/docs/", { key: null });
    expect(response.status).toBe(308);
    const location = response.headers.get("location") ?? "";
    expect(new URL(location, "https://proxy.example/licensing/docs/").pathname).toBe("/licensing/docs");
    expect(new URL(location, "http://licensing.test/docs/").pathname).toBe("/docs");
  });

  test("every script and stylesheet it references is served with the right type and real content", async () => {
    const { text } = await t.call("GET", "/docs", { key: null });
    const assets = [
      ...attributeValues(text, "script", "src").map((url) => ({ url, type: /javascript/ })),
      ...attributeValues(text, "link", "href").map((url) => ({ url, type: /text\/css/ })),
    ];
    expect(assets.length).toBeGreaterThanOrEqual(2);
    for (const { url, type } of assets) {
      const asset = await t.call("GET", new URL(url, "http://licensing.test/docs").pathname, { key: null });
      expect(`${url} ${asset.status}`).toBe(`${url} 200`);
      expect(asset.headers.get("content-type") ?? "").toMatch(type);
      expect(asset.text.length).toBeGreaterThan(10_000);
    }
  });

  test("the page points the reference UI at the same-origin OpenAPI document, which is served", async () => {
    const { text } = await t.call("GET", "/docs", { key: null });
    expect(text).toContain('url: "openapi.json"');
    expect(new URL("openapi.json", "http://licensing.test/docs").pathname).toBe("/openapi.json");
    const spec = await t.call("GET", "/openapi.json", { key: null });
    expect(spec.status).toBe(200);
  });

  test("an unknown documentation asset is a 404 with the error envelope", async () => {
    const response = await t.call("GET", "/docs/assets/nope", { key: null });
    expectEnvelope(response, "NOT_FOUND");
  });

  test("an asset path that tries to leave the asset folder is a 404", async () => {
    for (const path of ["/docs/assets/..%2Fpackage.json", "/docs/assets/%2E%2E%2Fsrc%2Fapp.ts"]) {
      const response = await t.call("GET", path, { key: null });
      expectEnvelope(response, "NOT_FOUND");
    }
  });
});

describe("GET / (the server's bare address)", () => {
  const BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8";

  test("a browser's navigation is sent to the reference at /docs with 303", async () => {
    const response = await t.call("GET", "/", { key: null, headers: { accept: BROWSER_ACCEPT } });
    expect(response.status).toBe(303);
    // Relative, so a proxy serving the service under /licensing/ leads to /licensing/docs.
    expect(response.headers.get("location")).toBe("docs");
    expect(response.text).toBe("");
  });

  test("any other client, or a browser refusing HTML, hears the 404 envelope as on any unknown path", async () => {
    for (const accept of [
      null,
      "*/*",
      "application/json",
      "text/html;q=0",
      "text/htmlx",
      "application/xhtml+xml",
    ]) {
      const response = await t.call("GET", "/", { key: null, headers: accept === null ? {} : { accept } });
      expect({ accept, status: response.status }).toEqual({ accept, status: 404 });
      expectEnvelope(response, "NOT_FOUND");
    }
  });

  test("only GET redirects, whatever the query; other methods and /favicon.ico are 404", async () => {
    const query = await t.call("GET", "/?next=https://evil.example", {
      key: null,
      headers: { accept: "text/html" },
    });
    expect(query.headers.get("location")).toBe("docs");
    for (const method of ["POST", "PUT", "DELETE"]) {
      const response = await t.call(method, "/", { key: null, headers: { accept: "text/html" } });
      expect({ method, status: response.status }).toEqual({ method, status: 404 });
    }
    expectEnvelope(
      await t.call("GET", "/favicon.ico", { key: null, headers: { accept: BROWSER_ACCEPT } }),
      "NOT_FOUND",
    );
  });
});

describe("GET /docs/errors", () => {
  test("answers an HTML page without an API key", async () => {
    const response = await t.call("GET", "/docs/errors", { key: null });
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toContain("text/html");
  });

  test("has exactly one element with id set to each error code", async () => {
    const { text } = await t.call("GET", "/docs/errors", { key: null });
    const codes = Object.keys(ERROR_CODES);
    expect(codes.length).toBeGreaterThan(30);
    const counts = codes.map((code) => `${code}=${text.split(`id="${code}"`).length - 1}`);
    expect(counts).toEqual(codes.map((code) => `${code}=1`));
  });

  test("documents no error code that the service does not have", async () => {
    const { text } = await t.call("GET", "/docs/errors", { key: null });
    const anchored = [...text.matchAll(/id="([A-Z][A-Z0-9_]+)"/g)].map((m) => m[1] as string);
    expect(anchored.filter((code) => !Object.hasOwn(ERROR_CODES, code))).toEqual([]);
  });

  test("states each code's HTTP status in its section", async () => {
    const { text } = await t.call("GET", "/docs/errors", { key: null });
    for (const [code, spec] of Object.entries(ERROR_CODES)) {
      const start = text.indexOf(`id="${code}"`);
      const next = text.indexOf('id="', start + 1);
      const section = text.slice(start, next === -1 ? undefined : next);
      expect(`${code}: ${section.includes(String(spec.status))}`).toBe(`${code}: true`);
    }
  });

  test("loads nothing from another origin", async () => {
    const { text } = await t.call("GET", "/docs/errors", { key: null });
    for (const url of [...attributeValues(text, "script", "src"), ...attributeValues(text, "link", "href")]) {
      expect(url).toMatch(/^\/[^/]/);
    }
  });
});

describe("links on the served pages", () => {
  const errorsSource = readFileSync(join(import.meta.dir, "../../docs/errors.md"), "utf8");
  test("every link of the error page leads to a page the server answers, or to a section of itself", async () => {
    const { text } = await t.call("GET", "/docs/errors", { key: null });
    const links = [...text.matchAll(/<a [^>]*href="([^"]*)"/g)].map((m) => m[1] as string);
    // The source has links to the repository's other documents (api.md), which are not served.
    expect(errorsSource).toMatch(/\]\(api\.md#/);
    for (const link of links) {
      if (link.startsWith("#")) {
        expect(text).toContain(`id="${link.slice(1)}"`);
        continue;
      }
      const response = await t.call("GET", new URL(link, "http://x/docs/errors").pathname, { key: null });
      expect(`${link}: ${response.status}`).toBe(`${link}: 200`);
    }
    expect(text).toContain("Idempotency-Key (docs/api.md)");
  });

  test("a link to a repository document becomes its name, whatever its anchor", () => {
    expect(withoutDocumentLinks("see [Keys](api.md#keys), [ops](operations.md) and [here](#X)")).toBe(
      "see Keys (docs/api.md), ops (docs/operations.md) and [here](#X)",
    );
  });
});

describe("doc_url of a real error", () => {
  test("an unauthenticated management request links to the UNAUTHENTICATED section, which exists", async () => {
    const response = await t.call("GET", "/mgmt/v1/products", { key: null });
    expectEnvelope(response, "UNAUTHENTICATED");
    const docUrl = new URL(response.body.error.doc_url);
    expect(docUrl.origin).toBe(new URL(BASE_URL).origin);
    expect(docUrl.hash).toBe("#UNAUTHENTICATED");
    const page = await t.call("GET", docUrl.pathname, { key: null });
    expect(page.status).toBe(200);
    expect(page.text).toContain(`id="${docUrl.hash.slice(1)}"`);
  });

  test("each error response carries the request id it reports", async () => {
    const first = await t.call("GET", "/mgmt/v1/products", { key: "lsk_live_notarealkey" });
    const second = await t.call("GET", "/mgmt/v1/products", { key: "lsk_live_notarealkey" });
    expectEnvelope(first, "UNAUTHENTICATED");
    expectEnvelope(second, "UNAUTHENTICATED");
    expect(first.body.error.request_id).not.toBe(second.body.error.request_id);
  });
});
