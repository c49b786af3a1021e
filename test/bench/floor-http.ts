/**
 * The HTTP + JSON floor: the least a JSON route can do on Bun. Reads the body, parses it, reads
 * the headers a device-proof route reads, and answers a JSON object of FLOOR_RESPONSE_BYTES
 * (the size of a real signed response), with nothing else. Run by run.ts under the same CPU
 * pinning and the same wrk setup as the server.
 *
 * GET /cpu answers this process's CPU time so far (`{"cpu_us": N}`): the bench reads it before
 * and after each slice, finer than /proc's 10 ms ticks.
 *
 * Usage: bun test/bench/floor-http.ts PORT [RESPONSE_BYTES]
 */
const port = Number(process.argv[2]);
const responseBytes = Number(process.argv[3] ?? 2000);
const padding = "x".repeat(Math.max(0, responseBytes - 60));

Bun.serve({
  hostname: "127.0.0.1",
  port,
  development: false,
  async fetch(request) {
    if (request.method === "GET") {
      if (new URL(request.url).pathname === "/cpu") {
        const { user, system } = process.cpuUsage();
        return Response.json({ cpu_us: user + system });
      }
      return Response.json({ data: "ok" });
    }
    const body = (await request.json()) as Record<string, unknown>;
    const nonce = request.headers.get("x-service-nonce") ?? request.headers.get("idempotency-key") ?? "";
    return Response.json(
      { data: { keys: Object.keys(body).length, nonce, padding } },
      { status: 200, headers: { "x-request-id": "req_floor" } },
    );
  },
});
console.log(`floor-http listening on ${port}`);
