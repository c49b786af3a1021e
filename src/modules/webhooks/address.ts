import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { ipv4ToInt, ipv6Groups } from "../../domain/ip-address.ts";

/**
 * The outbound address check run before every attempt (DESIGN §6,
 * LICENSING_WEBHOOK_ALLOW_PRIVATE_NETWORKS): a receiver URL must not reach loopback, private,
 * link-local, unique-local, cloud-metadata or otherwise non-public addresses, in IPv4 or IPv6
 * spelling (IPv4-mapped, IPv4-compatible, SIIT, NAT64, 6to4 and Teredo forms included), unless the
 * operator allows it. The ranges follow the IANA IPv4 and IPv6 Special-Purpose Address Registries:
 * every block not marked globally reachable is refused (test/unit/webhook-address.test.ts).
 */

/**
 * IPv4 ranges that are not the public internet: [network, prefix length]. The globally reachable
 * special-purpose blocks (AS112 192.31.196.0/24 and 192.175.48.0/24, AMT 192.52.193.0/24) are
 * left out: a receiver could sit there.
 */
const IPV4_BLOCKED: readonly [string, number][] = [
  ["0.0.0.0", 8], // "this network"
  ["10.0.0.0", 8],
  ["100.64.0.0", 10], // carrier-grade NAT
  ["127.0.0.0", 8],
  ["169.254.0.0", 16], // link-local, cloud metadata (169.254.169.254)
  ["172.16.0.0", 12],
  ["192.0.0.0", 24], // IETF protocol assignments
  ["192.0.2.0", 24], // documentation
  ["192.88.99.0", 24], // 6to4 relay anycast
  ["192.168.0.0", 16],
  ["168.63.129.16", 32], // Azure WireServer (host configuration and metadata, reachable from every VM)
  ["198.18.0.0", 15], // benchmarking
  ["198.51.100.0", 24],
  ["203.0.113.0", 24],
  ["224.0.0.0", 4], // multicast
  ["240.0.0.0", 4], // reserved, broadcast
];

function ipv4Blocked(address: string): boolean {
  const value = ipv4ToInt(address);
  if (value === null) return true;
  return IPV4_BLOCKED.some(([network, bits]) => {
    const base = ipv4ToInt(network) as number;
    const size = 2 ** (32 - bits);
    return value >= base && value < base + size;
  });
}

function ipv6Blocked(address: string): boolean {
  const g = ipv6Groups(address);
  if (!g) return true;
  const [a = 0, b = 0, c = 0, d = 0, e = 0, f = 0, h = 0, i = 0] = g;
  const embeddedV4 = () => `${h >> 8}.${h & 255}.${i >> 8}.${i & 255}`;
  const zeroTo = (n: number) => g.slice(0, n).every((x) => x === 0);
  // Forms that stand for an IPv4 address: that address decides.
  if (zeroTo(5) && f === 0xffff) return ipv4Blocked(embeddedV4()); // ::ffff:0:0/96 IPv4-mapped
  if (a === 0x64 && b === 0xff9b && c === 0 && d === 0 && e === 0 && f === 0)
    return ipv4Blocked(embeddedV4()); // 64:ff9b::/96 well-known NAT64 (globally reachable)
  if (a === 0x2002) return ipv4Blocked(`${b >> 8}.${b & 255}.${c >> 8}.${c & 255}`); // 6to4
  // All global unicast is in 2000::/3. Outside it everything is special-purpose or unallocated:
  // ::/128, ::1, IPv4-compatible ::a.b.c.d, SIIT ::ffff:0:a.b.c.d, 64:ff9b:1::/48 local-use
  // NAT64, 100::/64 discard-only and 100:0:0:1::/64 dummy, 5f00::/16 SRv6, fc00::/7 unique local
  // (fd00:ec2::254 metadata), fe80::/10 link-local, fec0::/10 site-local, ff00::/8 multicast.
  if ((a & 0xe000) !== 0x2000) return true;
  // 2001::/23 IETF protocol assignments: Teredo 2001::/32 (reaches whatever IPv4 address it
  // embeds), benchmarking, ORCHID, and anycast services no webhook receiver is.
  if (a === 0x2001 && b < 0x0200) return true;
  if (a === 0x2001 && b === 0x0db8) return true; // 2001:db8::/32 documentation
  if (a === 0x3fff && b < 0x1000) return true; // 3fff::/20 documentation
  return false;
}

/** True for every address a webhook must not reach by default; anything unparseable counts as blocked. */
export function isPrivateAddress(address: string): boolean {
  const version = isIP(address);
  if (version === 4) return ipv4Blocked(address);
  if (version === 6) return ipv6Blocked(address);
  return true;
}

/**
 * What the delivery log says of a refused host (AddressRefused says why so little). Where private
 * networks are not allowed, a name that does not resolve and one that resolves to a private address
 * are refused in the same words: two texts would tell which internal names exist.
 */
export const NO_PUBLIC_ADDRESS =
  "the host does not resolve to a public address (it has none, or a private, loopback, link-local or reserved one)";
/** Where private networks are allowed, only a name without an answer is refused. */
export const CANNOT_RESOLVE = "cannot resolve the host";

export type Resolver = (host: string) => Promise<string[]>;

/** The system resolver; every address it gives is checked, so a mix of public and private is refused. */
export const systemResolver: Resolver = async (host) => {
  if (isIP(host)) return [host];
  const found = await lookup(host, { all: true, verbatim: true });
  return found.map((entry) => entry.address);
};

/**
 * `message` goes into the delivery log, which anyone with `webhooks:read` reads: it never names an
 * address or the resolver's error, or endpoints pointed at internal names would map the network
 * the server sees (which names exist, where they point). `detail` has those, for the server log.
 */
export class AddressRefused extends Error {
  constructor(
    message: string,
    readonly detail: string,
  ) {
    super(message);
    this.name = "AddressRefused";
  }
}

/**
 * Resolves `host` and returns the addresses to connect to, in the resolver's order. Throws
 * AddressRefused when any answer is private (and that is not allowed) or there is no answer; a
 * name that does not exist and one the resolver failed on are refused in the same words, and so,
 * where private networks are not allowed, is a name with a private answer.
 */
export async function checkedAddresses(
  host: string,
  resolver: Resolver,
  allowPrivate: boolean,
): Promise<string[]> {
  const unresolved = allowPrivate ? CANNOT_RESOLVE : NO_PUBLIC_ADDRESS;
  let addresses: string[];
  try {
    addresses = await resolver(host);
  } catch (error) {
    throw new AddressRefused(unresolved, `cannot resolve ${host}: ${(error as Error).message}`);
  }
  if (addresses.length === 0) throw new AddressRefused(unresolved, `${host} has no address`);
  if (!allowPrivate) {
    const blocked = addresses.find(isPrivateAddress);
    if (blocked !== undefined) throw new AddressRefused(NO_PUBLIC_ADDRESS, `${host} resolves to ${blocked}`);
  }
  return addresses;
}
