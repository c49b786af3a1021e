import { describe, expect, test } from "bun:test";
import {
  addressPartition,
  clientAddress,
  forwardedAddress,
  type PeerSource,
  UNKNOWN_ADDRESS,
} from "../../src/http/client-address.ts";

/**
 * Where a request came from, for the per-address runtime limits: the last X-Forwarded-For entry
 * behind a trusted proxy, in whatever form load balancers write it, else the socket peer.
 */
const PEER = "198.51.100.9";

function from(forwarded: string | null, trust = true): string {
  const request = new Request("http://licensing.test/runtime/v1/time", {
    headers: forwarded === null ? {} : { "x-forwarded-for": forwarded },
  });
  clientAddress.set(request, PEER);
  return clientAddress.of(request, trust);
}

describe("X-Forwarded-For entries", () => {
  test.each([
    ["203.0.113.7", "203.0.113.7"],
    [" 203.0.113.7 ", "203.0.113.7"],
    ["203.0.113.7:51234", "203.0.113.7"],
    ["203.0.113.7:0", "203.0.113.7"],
    ["2001:db8::1", "2001:db8::1"],
    ["[2001:db8::1]", "2001:db8::1"],
    ["[2001:db8::1]:443", "2001:db8::1"],
    ["::ffff:203.0.113.7", "::ffff:203.0.113.7"],
    ["[::ffff:203.0.113.7]:8080", "::ffff:203.0.113.7"],
    ["fe80::1%eth0", "fe80::1%eth0"],
  ])("%p is the address %p", (entry, address) => {
    expect(forwardedAddress(entry)).toBe(address);
  });

  test.each([
    "",
    "unknown",
    "_hidden",
    "example.com",
    "example.com:443",
    "203.0.113.7:",
    "203.0.113.7:port",
    "203.0.113.7:123456",
    "203.0.113",
    "203.0.113.256",
    "[2001:db8::1",
    "[2001:db8::1]x",
    "[2001:db8::1]:",
    "[203.0.113.7]:80",
    "2001:db8::1:443:1:2:3:4:5",
    "1.2.3.4.5",
  ])("%p is not an address", (entry) => {
    expect(forwardedAddress(entry)).toBeNull();
  });

  test("behind a trusted proxy the last entry counts, without its port", () => {
    expect(from("10.0.0.1, 203.0.113.7:51234")).toBe("203.0.113.7");
    expect(from("[2001:db8::1]:443")).toBe("2001:db8::1");
  });

  test("a last entry that is not an address falls back to the socket peer, never an earlier entry", () => {
    expect(from("203.0.113.7, unknown")).toBe(PEER);
    expect(from("203.0.113.7, garbage:port")).toBe(PEER);
    expect(from("203.0.113.7,")).toBe(PEER);
    expect(from(`203.0.113.7, ${"1".repeat(100)}`)).toBe(PEER);
  });

  test("without a trusted proxy the header is ignored", () => {
    expect(from("203.0.113.7", false)).toBe(PEER);
    expect(from(null)).toBe(PEER);
  });

  test("every source port of one client shares its partition", () => {
    const partitions = new Set(
      ["203.0.113.7:1", "203.0.113.7:2", "203.0.113.7:65535", "203.0.113.7"].map((e) =>
        addressPartition(from(`10.0.0.1, ${e}`)),
      ),
    );
    expect([...partitions]).toEqual(["203.0.113.7"]);
    const v6 = new Set(
      ["[2001:db8:1:2::1]:443", "[2001:db8:1:2::9]:80", "2001:db8:1:2::1"].map((e) =>
        addressPartition(from(e)),
      ),
    );
    expect([...v6]).toEqual(["2001:db8:1:2::/64"]);
  });
});

describe("address partitions of unusual spellings", () => {
  test("IPv4-mapped IPv6 in hex counts as the IPv4 address", () => {
    expect(addressPartition("::ffff:cb00:7107")).toBe("203.0.113.7");
    expect(addressPartition("0:0:0:0:0:ffff:cb00:7107")).toBe("203.0.113.7");
  });

  test("something that is not an address is its own partition, never an IPv6 /64", () => {
    expect(addressPartition("unknown")).toBe("unknown");
  });
});

describe("the socket peer, looked up only when asked", () => {
  /** A real Bun server whose handler records its server as the source and answers `answer`. */
  async function serve(answer: (request: Request, source: PeerSource & { asked: number }) => string) {
    const server = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch(request, peer) {
        const source = {
          asked: 0,
          requestIP(r: Request) {
            this.asked++;
            return peer.requestIP(r);
          },
        };
        clientAddress.setSource(request, source);
        const body = answer(request, source);
        return new Response(`${body} asked=${source.asked}`);
      },
    });
    try {
      return await (
        await fetch(`http://127.0.0.1:${server.port}/`, { headers: { "x-forwarded-for": "203.0.113.7" } })
      ).text();
    } finally {
      server.stop(true);
    }
  }

  test("the peer is the socket's address, asked of the server once however often it is needed", async () => {
    expect(await serve((r) => [clientAddress.of(r, false), clientAddress.of(r, false)].join(" "))).toBe(
      "127.0.0.1 127.0.0.1 asked=1",
    );
  });

  test("a request whose address is never needed never asks the server", async () => {
    expect(await serve(() => "none")).toBe("none asked=0");
  });

  test("a trusted X-Forwarded-For answers without asking the server for the peer", async () => {
    expect(await serve((r) => clientAddress.of(r, true))).toBe("203.0.113.7 asked=0");
  });

  test("a server that no longer knows the peer (the client hung up) gives the unknown address", () => {
    const request = new Request("http://licensing.test/runtime/v1/time");
    clientAddress.setSource(request, { requestIP: () => null });
    expect(clientAddress.of(request, false)).toBe(UNKNOWN_ADDRESS);
    expect(clientAddress.of(new Request("http://licensing.test/"), false)).toBe(UNKNOWN_ADDRESS);
  });
});
