import { describe, expect, test } from "bun:test";
import { isPrivateAddress } from "../../src/modules/webhooks/address.ts";

/**
 * The webhook address check against the IANA IPv4 and IPv6 Special-Purpose Address Registries
 * (and cloud metadata endpoints): every block that is not globally reachable is refused, in every
 * spelling that reaches it; the globally reachable ones a receiver could really sit behind are not.
 */
const REFUSED: readonly [address: string, why: string][] = [
  // IPv4 special-purpose registry
  ["0.0.0.0", "0.0.0.0/8 this network"],
  ["0.255.255.255", "0.0.0.0/8 this network"],
  ["10.255.255.255", "10.0.0.0/8 private"],
  ["100.64.0.0", "100.64.0.0/10 shared address space (CGNAT)"],
  ["100.127.255.255", "100.64.0.0/10 shared address space (CGNAT)"],
  ["100.100.100.200", "Alibaba Cloud metadata (in 100.64.0.0/10)"],
  ["127.0.0.1", "loopback"],
  ["169.254.169.254", "link-local; AWS, GCP, Azure metadata"],
  ["172.16.0.1", "172.16.0.0/12 private"],
  ["192.0.0.1", "192.0.0.0/24 IETF protocol assignments"],
  ["192.0.0.192", "Oracle Cloud metadata (in 192.0.0.0/24)"],
  ["192.0.0.170", "NAT64 discovery (in 192.0.0.0/24)"],
  ["192.0.2.1", "TEST-NET-1"],
  ["192.88.99.1", "6to4 relay anycast (deprecated)"],
  ["192.168.1.1", "192.168.0.0/16 private"],
  ["198.18.0.1", "198.18.0.0/15 benchmarking"],
  ["198.19.255.255", "198.18.0.0/15 benchmarking"],
  ["198.51.100.1", "TEST-NET-2"],
  ["203.0.113.1", "TEST-NET-3"],
  ["224.0.0.1", "multicast"],
  ["239.255.255.250", "multicast"],
  ["240.0.0.1", "240.0.0.0/4 reserved"],
  ["255.255.255.255", "limited broadcast"],
  ["168.63.129.16", "Azure WireServer"],
  // IPv6 special-purpose registry
  ["::", "::/128 unspecified"],
  ["::1", "::1/128 loopback"],
  ["::ffff:127.0.0.1", "IPv4-mapped loopback"],
  ["::ffff:7f00:1", "IPv4-mapped loopback, hex spelling"],
  ["0:0:0:0:0:ffff:a9fe:a9fe", "IPv4-mapped metadata address"],
  ["::ffff:0:127.0.0.1", "::ffff:0:0:0/96 IPv4-translated (SIIT)"],
  ["::ffff:0:8.8.8.8", "::ffff:0:0:0/96 IPv4-translated (SIIT), even of a public address"],
  ["::127.0.0.1", "IPv4-compatible (deprecated)"],
  ["::8.8.8.8", "IPv4-compatible (deprecated), even of a public address"],
  ["64:ff9b::10.0.0.1", "64:ff9b::/96 NAT64 of a private address"],
  ["64:ff9b::a9fe:a9fe", "64:ff9b::/96 NAT64 of the metadata address"],
  ["64:ff9b:1::a9fe:a9fe", "64:ff9b:1::/48 local-use NAT64"],
  ["64:ff9b:1:ffff::8.8.8.8", "64:ff9b:1::/48 local-use NAT64, even of a public address"],
  ["100::1", "100::/64 discard-only"],
  ["100:0:0:1::1", "100:0:0:1::/64 dummy prefix"],
  ["2001::1", "2001::/32 Teredo"],
  ["2001:0:4136:e378:8000:63bf:80ff:fffe", "2001::/32 Teredo"],
  ["2001:2::1", "2001:2::/48 benchmarking"],
  ["2001:10::1", "2001:10::/28 ORCHID (deprecated)"],
  ["2001:20::1", "2001:20::/28 ORCHIDv2"],
  ["2001:1ff::1", "2001::/23 IETF protocol assignments"],
  ["2001:db8::1", "2001:db8::/32 documentation"],
  ["3fff::1", "3fff::/20 documentation"],
  ["3fff:fff::1", "3fff::/20 documentation"],
  ["2002:7f00:1::", "6to4 of loopback"],
  ["2002:c0a8:0101::1", "6to4 of a private address"],
  ["5f00::1", "5f00::/16 SRv6 SIDs"],
  ["fc00::1", "fc00::/7 unique local"],
  ["fd00:ec2::254", "AWS IPv6 metadata (unique local)"],
  ["fe80::1", "fe80::/10 link-local"],
  ["fe80::1%eth0", "link-local with a zone"],
  ["fec0::1", "fec0::/10 site-local (deprecated)"],
  ["ff02::1", "ff00::/8 multicast"],
  ["4000::1", "outside 2000::/3, unallocated"],
  ["1::1", "outside 2000::/3, unallocated"],
  // Not addresses
  ["not-an-address", "unparseable"],
  ["1.2.3", "unparseable"],
  ["0x7f.1", "unparseable"],
];

const ALLOWED: readonly [address: string, why: string][] = [
  ["8.8.8.8", "public IPv4"],
  ["93.184.216.34", "public IPv4"],
  ["100.63.255.255", "just below 100.64.0.0/10"],
  ["100.128.0.1", "just above 100.64.0.0/10"],
  ["172.32.0.1", "just above 172.16.0.0/12"],
  ["168.63.129.17", "next to Azure WireServer"],
  ["198.20.0.1", "just above 198.18.0.0/15"],
  ["223.255.255.255", "just below multicast"],
  ["::ffff:8.8.8.8", "IPv4-mapped public address"],
  ["64:ff9b::8.8.8.8", "64:ff9b::/96 NAT64 of a public address (globally reachable)"],
  ["2002:0808:0808::1", "6to4 of a public address"],
  ["2001:200::1", "first global unicast allocation after 2001::/23"],
  ["2001:4860:4860::8888", "public IPv6"],
  ["2606:4700:4700::1111", "public IPv6"],
  ["2001:db9::1", "just above 2001:db8::/32"],
  ["3ffe:1000::1", "below 3fff::/20"],
];

describe("webhook address check, IANA special-purpose registries", () => {
  test.each(REFUSED)("refuses %s (%s)", (address) => {
    expect(isPrivateAddress(address)).toBe(true);
  });

  test.each(ALLOWED)("allows %s (%s)", (address) => {
    expect(isPrivateAddress(address)).toBe(false);
  });
});
