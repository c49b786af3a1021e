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
 * The context of an `onRequest` hook with the path Elysia routes the request on: the composed
 * handler sets `path` before any hook runs, though Elysia's type for that context does not
 * declare it. The hooks that authenticate, limit and meter decide on this one, so they can never
 * disagree with the router about which route a request is (test/api/request-paths.test.ts).
 *
 * Hooks destructure what they use from it (`const { request, set, path } = context as ...`) and
 * never hand the context itself to a function: Elysia reads each hook's source to decide what to
 * prepare for every request, and a context passed whole makes it parse the cookies and the query
 * of every request for nothing (test/api/conventions.test.ts).
 */
export type WithRoutedPath<Context> = Context & { path: string };
