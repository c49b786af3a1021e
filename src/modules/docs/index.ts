import { createHash } from "node:crypto";
import { Elysia } from "elysia";
import swaggerCss from "swagger-ui-dist/swagger-ui.css" with { type: "text" };
import swaggerBundle from "swagger-ui-dist/swagger-ui-bundle.js" with { type: "text" };
import errorsMarkdown from "../../../docs/errors.md" with { type: "text" };
import { ApiError } from "../../http/errors.ts";

const ASSETS: Record<string, { body: string; type: string }> = {
  "swagger-ui.css": { body: swaggerCss, type: "text/css; charset=utf-8" },
  "swagger-ui-bundle.js": { body: swaggerBundle, type: "text/javascript; charset=utf-8" },
};

const page = (title: string, head: string, body: string) => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title}</title>${head}</head><body>${body}</body></html>`;

/**
 * The reference page's one inline script; the CSP allows it by its hash, and no other inline script.
 * Every URL the page uses is relative to it (/docs), so behind a proxy that serves the service under
 * a path prefix (and strips it) they stay under that prefix.
 */
const INIT_SCRIPT = `window.ui = SwaggerUIBundle({ url: "openapi.json", dom_id: "#swagger-ui", validatorUrl: null, deepLinking: true, tryItOutEnabled: false });`;

const REFERENCE_HTML = page(
  "Licensing Service API",
  '<link rel="stylesheet" href="docs/assets/swagger-ui.css">',
  `<div id="swagger-ui"></div><script src="docs/assets/swagger-ui-bundle.js"></script>
<script>${INIT_SCRIPT}</script>`,
);

/**
 * The served page has no other documents beside it: a link to one of the repository's (`api.md`)
 * becomes its name in the text, where a link would answer 404.
 */
export const withoutDocumentLinks = (markdown: string): string =>
  markdown.replace(/\[([^[\]]+)\]\(([\w-]+\.md)(#[^)\s]*)?\)/g, "$1 (docs/$2)");

const ERRORS_HTML = page(
  "Error codes · Licensing Service",
  "<style>body{font:16px/1.5 system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem}code{background:#f3f3f3;padding:0 .2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em}h2{margin-top:2rem}</style>",
  Bun.markdown.html(withoutDocumentLinks(errorsMarkdown)),
);

/** Scripts from our own assets and the init script by its hash; the errors page runs none. */
const csp = (scriptSrc: string) =>
  `default-src 'self'; script-src ${scriptSrc}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'`;
const REFERENCE_CSP = csp(`'self' 'sha256-${createHash("sha256").update(INIT_SCRIPT).digest("base64")}'`);
const ERRORS_CSP = csp("'none'");

const html = (body: string, policy: string) =>
  new Response(body, {
    headers: { "content-type": "text/html; charset=utf-8", "content-security-policy": policy },
  });

/**
 * Whether a request's Accept names HTML, as a browser's navigation does; curl's default (any
 * type) does not, and `text/html;q=0` refuses it (RFC 9110 §12.5.1).
 */
const wantsHtml = (accept: string | null) =>
  (accept ?? "").split(",").some((range) => {
    const [type, ...params] = range.split(";").map((part) => part.trim().toLowerCase());
    const refused = params.some((param) => /^q=0(\.0{0,3})?$/.test(param));
    return type === "text/html" && !refused;
  });

/** The browsable reference and error documentation, entirely from the binary: no CDN, works air-gapped. */
export const docsController = (openApiDocument: () => Record<string, unknown>) =>
  new Elysia({ detail: { hide: true } })
    // The server's bare address, opened in a browser, leads to the reference rather than to a JSON
    // 404; any other client hears the same 404 as before, as for every path outside the APIs.
    .get("/", ({ request }) => {
      if (!wantsHtml(request.headers.get("accept")))
        throw new ApiError("NOT_FOUND", "No route matches this method and path.");
      return new Response(null, { status: 303, headers: { location: "docs" } });
    })
    .get("/openapi.json", () => openApiDocument())
    .get("/docs", ({ request }) =>
      // The router serves /docs/ here too, where the page's relative URLs would miss by a level.
      new URL(request.url).pathname.endsWith("/")
        ? new Response(null, { status: 308, headers: { location: "../docs" } })
        : html(REFERENCE_HTML, REFERENCE_CSP),
    )
    .get("/docs/errors", () => html(ERRORS_HTML, ERRORS_CSP))
    .get("/docs/assets/:file", ({ params }) => {
      const asset = Object.hasOwn(ASSETS, params.file) ? ASSETS[params.file] : undefined;
      if (!asset) throw new ApiError("NOT_FOUND", "No such documentation asset.");
      return new Response(asset.body, {
        headers: { "content-type": asset.type, "cache-control": "public, max-age=86400" },
      });
    });
