/**
 * The address a request came from, for the per-address runtime limits. The HTTP server knows the
 * socket's peer and records it here before the app sees the request (server.ts); keyed by the
 * Request object, so nothing outlives the request.
 */
const peers = new WeakMap<Request, string>();

/** Used when nothing says where a request came from (app.handle without a server). */
export const UNKNOWN_ADDRESS = "unknown";

export const clientAddress = {
  /** The socket peer, as the server saw it. */
  set(request: Request, address: string | null | undefined): void {
    if (address) peers.set(request, address);
  },
  /**
   * With `trustForwardedFor` (the service runs behind a reverse proxy that appends the client's
   * address to X-Forwarded-For), the last entry of that header: the one the proxy added. Earlier
   * entries are whatever the client sent and are never trusted. Without it, the socket peer.
   */
  of(request: Request, trustForwardedFor: boolean): string {
    if (trustForwardedFor) {
      const forwarded = request.headers.get("x-forwarded-for");
      if (forwarded) {
        const last = forwarded.slice(forwarded.lastIndexOf(",") + 1).trim();
        if (last.length > 0 && last.length <= 64) return last;
      }
    }
    return peers.get(request) ?? UNKNOWN_ADDRESS;
  },
};

/**
 * The bucket an address is limited in. An IPv6 host usually holds a whole /64 and can send from any
 * address in it, so IPv6 addresses share one bucket per /64; IPv4-mapped IPv6 counts as IPv4.
 */
export function addressPartition(address: string): string {
  if (!address.includes(":")) return address;
  const lower = address.toLowerCase().split("%")[0] as string;
  if (lower.startsWith("::ffff:") && lower.includes(".")) return lower.slice(7);
  const [head = "", tail] = lower.split("::", 2);
  const headGroups = head === "" ? [] : head.split(":");
  const tailGroups = tail === undefined || tail === "" ? [] : tail.split(":");
  const groups =
    tail === undefined
      ? headGroups
      : [
          ...headGroups,
          ...Array(Math.max(0, 8 - headGroups.length - tailGroups.length)).fill("0"),
          ...tailGroups,
        ];
  return `${groups
    .slice(0, 4)
    .map((group) => group.replace(/^0+(?=.)/, ""))
    .join(":")}::/64`;
}
