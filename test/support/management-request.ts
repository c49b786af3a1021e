/**
 * A Management API request as the command-line tests send it to their in-process server
 * (`app.handle`): the API key, a JSON body, and a fresh Idempotency-Key, which creating routes need
 * and the others ignore.
 */
export function managementRequest(
  base: string,
  apiKey: string,
  method: string,
  path: string,
  body?: unknown,
): Request {
  return new Request(`${base}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${apiKey}`,
      "content-type": "application/json",
      "idempotency-key": `cli-test-${crypto.randomUUID()}`,
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}
