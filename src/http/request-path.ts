import type { PreContext } from "elysia";

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
 */
export type WithRoutedPath<Context> = Context & { path: string };

/**
 * An `onRequest` hook that reads the routed path, typed as Elysia expects. The hook must take
 * what it uses by destructuring its parameter (`({ request, set, path }) => ...`): Elysia reads
 * each hook's source to decide what every request's handler prepares, and a context parameter
 * used any other way can read to it as the context handed whole to a function, which makes every
 * request parse its cookies and query and copy its headers. In the minified executable that
 * happens by accident (`(s)=>{...Rb(i.headers,a)...}`: `s,` in `headers,` looks like `s` passed
 * on), so not even a destructuring in the body is safe (test/api/conventions.test.ts).
 */
export function routedHook<Result>(
  hook: (context: WithRoutedPath<PreContext>) => Result,
): (context: PreContext) => Result {
  return hook as (context: PreContext) => Result;
}

/**
 * A hook's context with `qi`, where the query starts in `request.url` (-1: no query). Elysia's
 * composed handler finds it once for every request while any `onRequest` hook exists (the
 * conventions' does) and hands it to every hook, though its type does not declare it; undefined
 * if a later Elysia stops doing so, when the hook must look for the `?` itself.
 */
export type WithQueryIndex<Context> = Context & { qi?: number };

/** A hook that reads `qi`, typed as Elysia expects (destructure it, as for `routedHook`). */
export function queryIndexHook<Context, Result>(
  hook: (context: WithQueryIndex<Context>) => Result,
): (context: Context) => Result {
  return hook as (context: Context) => Result;
}
