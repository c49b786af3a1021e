/** A JSON response with an explicit status, for handlers whose result is replayed or carries headers. */
export function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

export const noContent = (headers: Record<string, string> = {}): Response =>
  new Response(null, { status: 204, headers });
