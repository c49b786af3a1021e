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
