import { isIP } from "node:net";
import { ipv6Groups } from "../domain/ip-address.ts";

/**
 * The address a request came from, for the per-address runtime limits. The HTTP server records
 * where to find the socket's peer before the app sees the request (server.ts); keyed by the
 * Request object, so nothing outlives the request. Most requests never ask (the limits may be off,
 * most routes have none), so the server records its own handle and the peer is looked up only
 * when first asked: asking Bun for it allocates, about 1% of a heartbeat. Asked after the client
 * has hung up, Bun no longer knows the peer: such a request counts as UNKNOWN_ADDRESS, one window
 * shared by all of them, and its answer goes nowhere.
 */
const peers = new WeakMap<Request, string | PeerSource>();

/** What Bun's server passes to fetch: it knows each pending request's socket. */
export interface PeerSource {
  requestIP(request: Request): { address: string } | null;
}

/** Used when nothing says where a request came from (app.handle without a server). */
export const UNKNOWN_ADDRESS = "unknown";

export const clientAddress = {
  /** The socket peer, as the server saw it. */
  set(request: Request, address: string | null | undefined): void {
    if (address) peers.set(request, address);
  },
  /** The server that received the request: the peer is asked of it on first use. */
  setSource(request: Request, source: PeerSource): void {
    peers.set(request, source);
  },
  /**
   * With `trustForwardedFor` (the service runs behind a reverse proxy that appends the client's
   * address to X-Forwarded-For), the last entry of that header: the one the proxy added. Earlier
   * entries are whatever the client sent and are never trusted. Without it, or when the last entry
   * is not an address (see forwardedAddress), the socket peer: that is the proxy, so such requests
   * share its one window rather than getting a window each.
   */
  of(request: Request, trustForwardedFor: boolean): string {
    if (trustForwardedFor) {
      const forwarded = request.headers.get("x-forwarded-for");
      if (forwarded) {
        const address = forwardedAddress(forwarded.slice(forwarded.lastIndexOf(",") + 1));
        if (address !== null) return address;
      }
    }
    return peerOf(request);
  },
};

function peerOf(request: Request): string {
  const known = peers.get(request);
  if (known === undefined || typeof known === "string") return known ?? UNKNOWN_ADDRESS;
  const address = known.requestIP(request)?.address;
  if (!address) {
    peers.delete(request);
    return UNKNOWN_ADDRESS;
  }
  peers.set(request, address);
  return address;
}

/** Longer than any address with a zone and a port; anything longer is not parsed. */
const MAX_ENTRY = 64;
const PORT = /^\d{1,5}$/;

/**
 * The address in one X-Forwarded-For entry, or null when it is not one. Some load balancers
 * write the client's source port too (`203.0.113.7:51234`, `[2001:db8::1]:443`): it is dropped,
 * or every connection of one client would get a window of its own.
 */
export function forwardedAddress(entry: string): string | null {
  let text = entry.trim();
  if (text.length === 0 || text.length > MAX_ENTRY) return null;
  if (text.startsWith("[")) {
    const end = text.indexOf("]");
    if (end === -1) return null;
    const rest = text.slice(end + 1);
    if (rest !== "" && !(rest.startsWith(":") && PORT.test(rest.slice(1)))) return null;
    text = text.slice(1, end);
    return isIP(withoutZone(text)) === 6 ? text : null;
  }
  const colon = text.indexOf(":");
  // One colon: IPv4 with a port (an IPv6 address has at least two).
  if (colon !== -1 && colon === text.lastIndexOf(":")) {
    if (!PORT.test(text.slice(colon + 1))) return null;
    text = text.slice(0, colon);
    return isIP(text) === 4 ? text : null;
  }
  return isIP(withoutZone(text)) !== 0 ? text : null;
}

const withoutZone = (address: string) => address.split("%")[0] as string;

/**
 * The bucket an address is limited in. An IPv6 host usually holds a whole /64 and can send from any
 * address in it, so IPv6 addresses share one bucket per /64; IPv4-mapped IPv6 (in either spelling)
 * counts as IPv4. Anything else (UNKNOWN_ADDRESS) is a bucket of its own.
 */
export function addressPartition(address: string): string {
  const plain = withoutZone(address).toLowerCase();
  const version = isIP(plain);
  if (version === 4) return plain;
  if (version !== 6) return address;
  // isIP accepted it: never null.
  const groups = ipv6Groups(plain) ?? [];
  if (groups.slice(0, 5).every((g) => g === 0) && groups[5] === 0xffff) {
    const [h = 0, l = 0] = groups.slice(6);
    return `${h >> 8}.${h & 255}.${l >> 8}.${l & 255}`;
  }
  return `${groups
    .slice(0, 4)
    .map((g) => g.toString(16))
    .join(":")}::/64`;
}
