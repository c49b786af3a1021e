/**
 * The path of an absolute request URL (Bun hands handlers `http://host/path?query`), found by
 * index instead of building a URL object: every request asks for it several times.
 */
export function pathAndQueryOf(url: string): string {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  return start === -1 ? "/" : url.slice(start);
}

/** The path without the query (queries can carry cursors and emails that do not belong in logs). */
export function pathOf(url: string): string {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start === -1) return "/";
  const query = url.indexOf("?", start);
  return query === -1 ? url.slice(start) : url.slice(start, query);
}

/**
 * The path Elysia routes a request on. Its `onRequest` context carries it (the composed handler
 * sets `path` before any hook runs) though Elysia's type for that context does not declare it.
 * The hooks that authenticate, limit and meter decide on this one, so they can never disagree
 * with the router about which route a request is (test/api/request-paths.test.ts).
 */
export const routedPath = (context: object): string => (context as { path: string }).path;
