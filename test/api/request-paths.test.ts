import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { connect } from "node:net";
import type { RunningServer } from "../../src/server.ts";
import { createTestContext, serveTestStore, type TestContext } from "../support/harness.ts";

/**
 * The path a request is routed on, limited on and authenticated on is one and the same, whatever
 * the Host header says. Through the real server and a raw socket, because these requests are the
 * ones a well-behaved client (fetch) never sends.
 */
let t: TestContext;
let productId: string;
let server: RunningServer;
let port: number;

beforeAll(async () => {
  t = createTestContext();
  const product = await t.call("POST", "/mgmt/v1/products", {
    body: { name: "Paths", code: "paths", environment: "live" },
    headers: t.idem(),
  });
  productId = product.body.data.public_id;
  server = serveTestStore(t, { LICENSING_RUNTIME_RATE_LIMIT_IP: "2/60" });
  port = Number(new URL(server.url).port);
});
afterAll(async () => {
  await server.shutdown("test done");
  t.close();
});

/** Sends `head` (request line and headers, CRLF-separated, without the blank line) and a body. */
function raw(head: string, body = "", to = port): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    let received = "";
    const socket = connect(to, "127.0.0.1", () => {
      socket.write(
        `${head}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
      );
    });
    socket.on("data", (chunk) => {
      received += chunk.toString();
    });
    socket.on("error", reject);
    socket.on("close", () => {
      const status = Number(received.split(" ")[1]);
      resolve({ status, body: received.slice(received.indexOf("\r\n\r\n") + 4) });
    });
  });
}

const timeBody = () => JSON.stringify({ product_id: productId, nonce: "a-time-nonce-of-enough-length" });
const time = (host: string, path = "/runtime/v1/time") =>
  raw(`POST ${path} HTTP/1.1\r\nHost: ${host}\r\nContent-Type: application/json`, timeBody());

describe("the Host header does not move the path", () => {
  test("a server reached by a short host name (Host: api) answers its routes and limits them like any other", async () => {
    const first = await time("api");
    expect(first.status).toBe(200);
    expect(JSON.parse(first.body).data).toBeString();
    expect((await time("api")).status).toBe(200);
    // The per-address window (2 per minute) counted both: the third is refused.
    const third = await time("api");
    expect(third.status).toBe(429);
    expect(JSON.parse(third.body).error.code).toBe("RATE_LIMITED");
  });

  test("a path that only contains a runtime route after a short host is not routed to it, limited or not", async () => {
    for (const host of ["a", "ab", "abc"]) {
      const response = await time(host, "/xx/runtime/v1/time");
      expect(response.status).toBe(404);
      expect(JSON.parse(response.body).error.code).toBe("NOT_FOUND");
    }
  });

  test("a management path after a short host still needs an API key", async () => {
    const response = await raw("GET /mgmt/v1/products HTTP/1.1\r\nHost: a");
    expect(response.status).toBe(401);
    expect(JSON.parse(response.body).error.code).toBe("UNAUTHENTICATED");
  });
});

describe("requests without a host", () => {
  test("a load balancer's HTTP/1.0 health probe without a Host header is answered", async () => {
    for (const path of ["/healthz", "/readyz"]) {
      const response = await raw(`GET ${path} HTTP/1.0`);
      expect(response.status).toBe(200);
    }
  });

  test("a management route without a Host header is routed, and still needs an API key", async () => {
    for (const head of ["GET /mgmt/v1/products HTTP/1.0", "GET /mgmt/v1/products HTTP/1.1\r\nHost: "]) {
      const response = await raw(head);
      expect(response.status).toBe(401);
      expect(JSON.parse(response.body).error.code).toBe("UNAUTHENTICATED");
    }
  });

  test("a runtime call without a Host header is answered and limited like any other, by its socket's address", async () => {
    // A server of its own, with a fresh per-address window of one call a minute: in place of the
    // file's server, since one data directory takes one server (serve.lock).
    await server.shutdown("replaced for one test");
    const own = serveTestStore(t, { LICENSING_RUNTIME_RATE_LIMIT_IP: "1/60" });
    try {
      const ownPort = Number(new URL(own.url).port);
      const withoutHost = "POST /runtime/v1/time HTTP/1.0\r\nContent-Type: application/json";
      const answered = await raw(withoutHost, timeBody(), ownPort);
      expect(answered.status).toBe(200);
      expect(JSON.parse(answered.body).data).toBeString();
      // The same socket address with a Host header finds the window used: the call without one
      // was counted against 127.0.0.1, not against an "unknown" address of its own.
      const withHost = "POST /runtime/v1/time HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json";
      const limited = await raw(withHost, timeBody(), ownPort);
      expect(limited.status).toBe(429);
      expect(JSON.parse(limited.body).error.details.policy).toBe("runtime-ip");
    } finally {
      await own.shutdown("test done");
      server = serveTestStore(t, { LICENSING_RUNTIME_RATE_LIMIT_IP: "2/60" });
      port = Number(new URL(server.url).port);
    }
  });
});
